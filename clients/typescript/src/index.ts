// Taskgrid from Node: a Client for the scheduler's gRPC API and a Worker
// that runs functions as tasks.
export { BulkFilter, BulkResult, Client, ClientOptions, Message, OutputMessage, Task, TaskEvent, TaskResult, TaskgridError, duration, stateName } from "./client";
export { PermanentError, TaskContext, TaskFunction, Worker, WorkerOptions } from "./worker";
