"""Fixtures: a real scheduler (and agents) from the build, through the system
tests' harness (tests/system/harness.py), each test in its own directory
with its own ports. TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL
name the binaries."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "system"))
import harness  # noqa: E402

import taskgrid  # noqa: E402


@pytest.fixture
def cluster():
    c = harness.Cluster()
    try:
        c.start_scheduler()
        yield c
    except BaseException:
        c.dump_logs()
        raise
    finally:
        c.close()


@pytest.fixture
def client(cluster):
    with taskgrid.Client(cluster.addr, timeout=30, failover_for=30) as c:
        yield c


def wait_until(cond, timeout=60, what="the condition"):
    return harness.wait_until(cond, timeout=timeout, what=what)
