"""Taskgrid from Python: a Client for the scheduler's API and a Worker that
runs Python functions as tasks.

    from taskgrid import Client
    client = Client("127.0.0.1:7070")
    task = client.submit({"id": "hello", "steps": [{"exec": {"argv": ["echo", "hi"]}}]})
    print(state_name(client.wait("hello").state))        # SUCCEEDED

The generated messages are taskgrid.v1.task_pb2 and its siblings.
"""
from taskgrid.client import Client, TaskgridError, duration, state_name
from taskgrid.worker import PermanentError, Worker

__all__ = ["Client", "TaskgridError", "Worker", "PermanentError", "state_name", "duration"]
__version__ = "0.1.0"
