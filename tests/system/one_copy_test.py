"""One copy of an attempt at a time, whatever happens to the processes
around it: no step of a task runs beside another attempt of the same task,
no step outlives the attempt it belongs to, no resource is handed over
while the step that holds it still runs, and nothing an agent or a step
does (a restart, a kill of its supervisor, a stop) keeps a task from
ending with the one result it produced.

The cases, with the real binaries, each in a cluster of its own:

1. a kept step (taskgrid-agent --keep_steps) outlives its attempt timeout
   while no agent is attached: its supervisor stops it at the timeout, and
   the task's next attempt starts after its last tick; (b) the agent comes
   back after the timeout passed: attempt 1 ends TIMED_OUT;
2. a step that ignores SIGTERM at its attempt timeout keeps its resource
   (gpu=1) until it is gone: neither its next attempt nor another task
   asking for the gpu starts while it ticks;
3. a step that escapes its supervisor (setsid, a double fork, a kill -9 of
   the supervisor, both) leaves nothing running once its attempt ended,
   and an attempt 1 never writes beside attempt 2;
4. a step that stops its supervisor (SIGSTOP) still ends at its step
   timeout, or when cancelled, and frees its slot;
5. a kept step cannot be read by another process of the same user while
   its agent is away, and a kept step whose supervisor does not answer the
   returning agent is killed before the task runs again (not counted);
6. a result produced during a scheduler outage outlives an agent restart
   (SIGTERM); after kill -9 of the agent, the lost result is not counted;
7. results of a chain resent out of order after a scheduler restart
   finish the job and free the slot;
8. a schedule_timeout passes while the task is DISPATCHED to a frozen
   agent (and across a scheduler restart): it ends FAILED, never run.

Every step writes timestamps and pids of its own into the test's
directory, so what ran when is read from the steps themselves. Tests of
escapes and of attacks on the supervisor run the agent with
--confine_steps=false (no Landlock domain: the fallbacks must hold without
it), some also with the default.

Run through ctest (system.one_copy), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import json
import os
import signal
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, alive, processes_with, unix_time, wait_until, written  # noqa: E402

# The agent's flags for the steps to run without a Landlock domain.
CONFINE_OFF = ["--confine_steps=false"]
# Short heartbeats, so a reconnect is noticed and answered quickly.
FAST = ["--heartbeat_interval=250ms"]
# Retries after 200 ms instead of the default second.
QUICK_RETRY = {"initial_backoff": "0.2s"}
ENDED = ["SUCCEEDED", "FAILED", "CANCELLED"]

# Attempt 1 ticks every 50 ms for about 25 s (500 ticks), a later attempt
# for about a second (20); each to a file of its own.
TICKING = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
date +%s.%N > "$d/start.$a"; echo $$ > "$d/pid.$a"
n=20; [ "$a" = 1 ] && n=500
i=0; while [ $i -lt $n ]; do date +%s.%N >> "$d/ticks.$a"; sleep 0.05; i=$((i+1)); done
"""

# Attempt 1 ticks until SIGTERM, then goes on ticking for 7 s and exits 0;
# a later attempt ends at once.
TERM_IGNORING = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
date +%s.%N > "$d/start.$a"; echo $$ > "$d/pid.$a"
[ "$a" = 1 ] || exit 0
trap 'date +%s.%N > "$d/term"; i=0
  while [ $i -lt 140 ]; do date +%s.%N >> "$d/ticks.1"; sleep 0.05; i=$((i+1)); done
  exit 0' TERM
i=0; while [ $i -lt 1200 ]; do date +%s.%N >> "$d/ticks.1"; sleep 0.05; i=$((i+1)); done
"""

# What a step leaves running: writes its pid to pid.NAME, then a tick
# every 50 ms to ticks.NAME (bounded: about 2 minutes).
TICKER = r"""
echo $$ > "$1/pid.$2"
i=0; while [ $i -lt 2400 ]; do date +%s.%N >> "$1/ticks.$2"; sleep 0.05; i=$((i+1)); done
"""

# The escapes of case 3: each starts the ticker "gc" somewhere the
# supervisor may lose it, waits for its first tick, then ends (or kills
# its supervisor, $PPID, first and sleeps 5 s).
WAIT_GC = r'i=0; while [ ! -s "$d/ticks.gc" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done'
ESCAPES = {
    "setsid": 'setsid sh "$d/ticker" "$d" gc &\n' + WAIT_GC,
    "double-fork": 'sh -c \'sh "$0/ticker" "$0" gc &\' "$d"\n' + WAIT_GC,
    "kill-supervisor": ('setsid sh "$d/ticker" "$d" gc &\n' + WAIT_GC +
                        '\nsleep 0.3; kill -9 $PPID; sleep 5'),
    "double-fork-kill-supervisor": ('sh -c \'sh "$0/ticker" "$0" gc &\' "$d"\n' + WAIT_GC +
                                    '\nsleep 0.3; kill -9 $PPID; sleep 5'),
}
ESCAPE_STEP = 'd="$1"; echo $$ > "$d/pid.step"; echo $PPID > "$d/supervisor"\n'

# The case: attempt 1 leaves a writer of "attempt 1" lines in a
# session of its own and kills its supervisor; attempt 2 writes 20
# "attempt 2" lines to the same file and ends.
ONE_FILE = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
echo $PPID > "$d/supervisor.$a"
if [ "$a" = 1 ]; then
  setsid sh -c 'echo $$ > "$0/pid.writer"; i=0
    while [ $i -lt 2400 ]; do
      echo "attempt 1 $(date +%s.%N)" >> "$0/lines"; sleep 0.05; i=$((i+1))
    done' "$d" &
  i=0; while [ ! -s "$d/lines" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
  sleep 0.3; kill -9 $PPID; sleep 5
else
  i=0; while [ $i -lt 20 ]; do
    echo "attempt $a $(date +%s.%N)" >> "$d/lines"; sleep 0.05; i=$((i+1))
  done
fi
"""

# Stops its own supervisor, then waits on a `sleep 3000`.
STOPPER = r"""
d="$1"
echo $PPID > "$d/supervisor"; echo $$ > "$d/pid.step"
kill -STOP $PPID
sleep 3000 & echo $! > "$d/pid.sleep"
wait
"""

# Prints a line every 50 ms (and keeps a copy of each) until the test's
# "go" (bounded: 60 s), then "done" and its output.
PRINTING = r"""
d="$1"; echo $$ > "$d/pid.$TASKGRID_ATTEMPT"
i=0; while [ ! -e "$d/go" ] && [ $i -lt 1200 ]; do
  echo "line $i"; echo "line $i" >> "$d/expected"; sleep 0.05; i=$((i+1))
done
echo done; echo done >> "$d/expected"
echo "output 5" > "$TASKGRID_OUTPUT"
"""

# Attempt 1 ticks (bounded: about 2 minutes); a later attempt ends at once.
TICK_THEN_QUICK = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
date +%s.%N > "$d/start.$a"; echo $$ > "$d/pid.$a"
[ "$a" = 1 ] || exit 0
i=0; while [ $i -lt 2400 ]; do date +%s.%N >> "$d/ticks.1"; sleep 0.05; i=$((i+1)); done
"""

# Waits for the test's "go" (bounded: 60 s), then writes its output and a
# done marker.
AFTER_GO = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
date +%s.%N > "$d/start.$a"; echo $$ > "$d/pid.$a"; echo $PPID > "$d/supervisor.$a"
i=0; while [ ! -e "$d/go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
echo "stdout $a"
echo "output $a" > "$TASKGRID_OUTPUT"
date +%s.%N > "$d/done.$a"
"""


def b64(field):
    return base64.b64decode(field or "").decode()


def times(path):
    """Every timestamp a step wrote to `path` (none while it does not exist)."""
    return [float(x) for x in written(path).split()]


def started(d):
    """The attempts whose step wrote start.N in `d`, in order."""
    return sorted(int(f.split(".")[1]) for f in os.listdir(d)
                  if f.startswith("start.") and f.split(".")[1].isdigit())


def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


def history(task):
    """(attempt, agent, outcome, interrupted) of every finished attempt."""
    return [(a.get("attempt"), a.get("agent_id"),
             a.get("result", {}).get("outcome", "").replace("OUTCOME_", ""),
             bool(a.get("interrupted"))) for a in task.get("attempts", [])]


def proc_state(pid):
    """The state letter of /proc/PID/stat ("T" when stopped), "" when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def step_sockets():
    """{name: socket type} of the abstract unix sockets listed in
    /proc/net/unix whose name starts with taskgrid-step- (no leading @)."""
    found = {}
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("@taskgrid-step-"):
                found[fields[7][1:]] = int(fields[4], 16)
    return found


def hijack(name, sock_type):
    """Connects to the abstract socket `name` as any process of the user
    could, reads for a second, sends a garbage 64-byte record, reads half
    a second more; returns (connected, bytes read)."""
    s = socket.socket(socket.AF_UNIX, sock_type)
    got = b""
    try:
        s.settimeout(2)
        try:
            s.connect("\0" + name)
        except OSError:
            return False, b""
        for seconds, send in ((1.0, b"\xa5" * 64), (0.5, None)):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return True, got
                if not data:
                    return True, got
                got += data
            if send:
                try:
                    s.sendall(send)
                except OSError:
                    return True, got
        return True, got
    finally:
        s.close()


class OneCopyTest(unittest.TestCase):

    def setUp(self):
        self.pids = []      # processes of steps, killed in tearDown
        self.dirs = []      # the clusters' directories: what runs there goes too

    def tearDown(self):
        # A failed test must leave nothing behind: its steps' recorded pids
        # (stopped supervisors too: SIGKILL ends a stopped process), then
        # whatever still names one of its directories in its command line
        # or environment (agents, supervisors, escaped steps).
        mine = set()
        for d in self.dirs:
            mine.update(processes_with(d + "/") + processes_with(d + "/", "environ"))
        # A recorded pid is killed only while it is still one of ours (not
        # reused by now).
        for pid in [p for p in self.pids if p in mine] + sorted(mine):
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    # --- helpers --------------------------------------------------------------

    def cluster(self, scheduler_flags=()):
        c = Cluster(scheduler_flags=list(scheduler_flags))
        self.dirs.append(c.dir)
        c.steps = os.path.join(c.dir, "steps")
        os.mkdir(c.steps)
        with open(os.path.join(c.steps, "ticker"), "w") as f:
            f.write(TICKER)
        return c

    def agent(self, c, agent_id, slots=1, flags=(), wait=True):
        """Starts an agent; with `wait`, until the scheduler lists it active
        (an agent that exits first, e.g. on a flag it does not know, fails
        the test at once)."""
        agent = c.start_agent(agent_id, slots=slots, extra_flags=list(flags))
        if wait:
            def up():
                if not agent.alive():
                    self.fail(f"agent {agent_id} exited at start:\n{agent.log()[-3000:]}")
                info = c.agents_info().get(agent_id, {})
                return info.get("state") == "AGENT_STATE_ACTIVE"
            wait_until(up, what=f"agent {agent_id} to connect")
        return agent

    def ended(self, c, task_id, timeout, seen=lambda: "", fail=True):
        """The task once it ended (SUCCEEDED, FAILED or CANCELLED). If it did
        not within `timeout` s: fails the test with where it stands and what
        seen() says, or (not `fail`) returns it as it stands."""
        last = {}

        def done():
            nonlocal last
            last = c.task(task_id)
            return state(last) in ENDED
        try:
            return wait_until(done, timeout=timeout, interval=0.1,
                              what=f"{task_id} to end") and last
        except TimeoutError:
            pass
        if fail:
            self.fail(f"{task_id} did not end within {timeout} s: {state(last)}, attempt "
                      f"{last.get('attempt')} ({last.get('reason')}), {history(last)}; "
                      f"{seen()}")
        return last

    def submit(self, c, *specs):
        c.ctl("submit", "-f", "-", input=json.dumps(list(specs)), check=True)

    def pid_of(self, path, timeout=30):
        pid = int(wait_until(lambda: written(path), timeout=timeout, what=f"a pid in {path}"))
        self.pids.append(pid)
        return pid

    def exec_step(self, script, d, timeout=None):
        step = {"exec": {"argv": ["sh", "-c", script, "step", d]}}
        if timeout:
            step["timeout"] = timeout
        return step

    def assert_in_turn(self, d):
        """No tick of an attempt is later than the start (or first tick) of
        the next attempt that ran (some may never start: rejected);
        returns ({N: (first, last)}, the spans as text)."""
        span = {}
        for n in started(d):
            stamps = times(f"{d}/start.{n}") + times(f"{d}/ticks.{n}")
            if stamps:
                span[n] = (min(stamps), max(stamps))
        ran = sorted(span)
        base = span[ran[0]][0] if ran else 0
        text = ", ".join(f"attempt {n} {span[n][0] - base:+.1f}..{span[n][1] - base:+.1f} s"
                         for n in ran)
        for a, b in zip(ran, ran[1:]):
            self.assertLess(span[a][1], span[b][0],
                            f"attempt {a} ran beside attempt {b}: {text}")
        return span, text

    # --- 1. a kept step and its attempt timeout -------------------------------

    def kept_past_timeout(self, case, come_back):
        """Runs TICKING (attempt_timeout 4s) on an agent with --keep_steps=10s,
        SIGTERMs the agent 1.5 s into the attempt; then starts another agent
        at once (come_back False), or the same one 6 s into the attempt.
        Returns the cluster, the task, attempt 1's start and the spans."""
        c = self.cluster(FAST + ["--reconnect_grace=1s"])
        with c:
            c.start_scheduler()
            keeper_id = f"keeper-{case}"
            flags = ["--keep_steps=10s", "--kill_grace=1s",
                     f"--work_dir={os.path.join(c.dir, 'work-' + keeper_id)}"]
            keeper = self.agent(c, keeper_id, flags=flags)
            d = c.steps
            task_id = f"kept-past-timeout-{case}"
            self.submit(c, {"id": task_id, "queue": f"one-copy-{case}", "max_attempts": 3,
                            "attempt_timeout": "4s", "retry": QUICK_RETRY,
                            "steps": [self.exec_step(TICKING, d)]})
            wait_until(lambda: written(f"{d}/ticks.1"), what="attempt 1's first tick")
            start1 = float(written(f"{d}/start.1"))
            pid1 = self.pid_of(f"{d}/pid.1")
            # Deliberately 1.5 s into the attempt: well before its 4 s timeout.
            wait_until(lambda: time.time() >= start1 + 1.5, what="1.5 s of attempt 1")
            keeper.signal(signal.SIGTERM)
            self.assertEqual(keeper.proc.wait(timeout=30), 0, keeper.log()[-3000:])
            self.assertTrue(alive(pid1), "the kept step went with its agent")
            if come_back:
                # Deliberately 2 s past the 4 s attempt timeout, within the
                # 10 s hold and before the scheduler's own deadline (4 s + 5 s).
                wait_until(lambda: time.time() >= start1 + 6.0, what="6 s of attempt 1")
                self.agent(c, keeper_id, flags=flags)
            else:
                self.agent(c, f"heir-{case}")
            task = self.ended(c, task_id, 90)
            wait_until(lambda: not alive(pid1), timeout=60, what="attempt 1's step to end")
            for n in started(d)[1:]:  # what later attempts started ends too
                pid = self.pid_of(f"{d}/pid.{n}")
                wait_until(lambda: not alive(pid), timeout=60, what=f"attempt {n}'s step to end")
            span, text = self.assert_in_turn(d)
            last1 = span[1][1]
            # Stopped at its timeout by its supervisor: 4 s, then SIGTERM,
            # which ends the loop at once (kill grace 1 s), plus 2.5 s for a
            # slow machine. The hold (10 s from +1.5 s) is longer, and so is
            # the agent's absence in case 1b (back at +6 s).
            self.assertLess(last1 - start1, 4 + 1 + 2.5,
                            f"attempt 1 ran on past its 4 s timeout with no agent: {text}")
            return c, c.task(task_id), start1, span, text

    def test_1a_kept_step_stops_at_its_attempt_timeout_with_no_agent(self):
        c, task, start1, span, text = self.kept_past_timeout("1a", come_back=False)
        print(f"\n[one_copy] 1a kept step, attempt_timeout 4s, agent gone at +1.5 s, heir at "
              f"once: {text}; task {state(task)} {history(task)}", flush=True)

    def test_1b_kept_step_past_its_timeout_ends_timed_out_when_its_agent_is_back(self):
        c, task, start1, span, text = self.kept_past_timeout("1b", come_back=True)
        first = task["attempts"][0]
        self.assertEqual(first["attempt"], 1, history(task))
        self.assertEqual(first["result"]["outcome"], "OUTCOME_TIMED_OUT", first)
        self.assertGreater(len(span), 1, f"no attempt ran after attempt 1: {history(task)}")
        print(f"\n[one_copy] 1b kept step, attempt_timeout 4s, agent back at +6 s: {text}; "
              f"task {state(task)} {history(task)}", flush=True)

    # --- 2. the timeout path frees on the agent's word ------------------------

    def test_2_a_step_ignoring_sigterm_keeps_its_gpu_until_it_is_gone(self):
        with self.cluster(FAST) as c:
            c.start_scheduler()
            self.agent(c, "gpu-2", slots=4, flags=["--kill_grace=8s", "--resources=gpu=1"])
            d = c.steps
            gpu = {"resources": {"gpu": "1"}}
            self.submit(c, {"id": "term-ignoring-2", "queue": "one-copy-2", "max_attempts": 2,
                            "attempt_timeout": "2s", "retry": QUICK_RETRY, "placement": gpu,
                            "steps": [self.exec_step(TERM_IGNORING, d)]})
            wait_until(lambda: written(f"{d}/ticks.1"), what="attempt 1's first tick")
            self.pid_of(f"{d}/pid.1")
            waiting = r'date +%s.%N > "$1/t2.start"'
            self.submit(c, {"id": "gpu-waiter-2", "queue": "one-copy-2", "placement": gpu,
                            "steps": [self.exec_step(waiting, d)]})
            t1 = self.ended(c, "term-ignoring-2", 90)
            t2 = self.ended(c, "gpu-waiter-2", 90)
            self.assertTrue(written(f"{d}/term"), "attempt 1 never got its SIGTERM")
            wait_until(lambda: not alive(int(written(f"{d}/pid.1"))), timeout=30,
                       what="attempt 1's step to end")
            start1 = float(written(f"{d}/start.1"))
            term = float(written(f"{d}/term"))
            last1 = times(f"{d}/ticks.1")[-1]
            later = started(d)[1:]  # the attempts after 1 that started (some are rejected)
            start2 = [float(written(f"{d}/start.{n}")) for n in later]
            t2_start = times(f"{d}/t2.start")
            when = (f"attempt 1 started at 0, got SIGTERM at {term - start1:+.1f} s, ticked "
                    f"until {last1 - start1:+.1f} s; the next attempt that started "
                    f"({later[:1]}) at {[round(s - start1, 1) for s in start2[:1]]}, the "
                    f"waiting task at {[round(s - start1, 1) for s in t2_start]}")
            self.assertTrue(start2 and t2_start, f"{when}; {history(t1)} {history(t2)}")
            self.assertLess(last1, t2_start[0],
                            "the gpu went to another task while attempt 1 ran: " + when)
            self.assertLess(last1, start2[0],
                            "the next attempt started while attempt 1 ran: " + when)
            self.assertEqual(state(t1), "SUCCEEDED", history(t1))
            self.assertEqual(state(t2), "SUCCEEDED", history(t2))
            print(f"\n[one_copy] 2 attempt_timeout 2s, SIGTERM ignored for 7 s, kill grace 8 s: "
                  f"{when}", flush=True)

    # --- 3. a step that escapes its supervisor --------------------------------

    def escape(self, case, how, flags):
        with self.cluster(FAST) as c:
            c.start_scheduler()
            self.agent(c, f"escapes-{case}", flags=["--kill_grace=1s"] + flags)
            d = c.steps
            task_id = f"escape-{case}"
            self.submit(c, {"id": task_id, "queue": f"one-copy-{case}", "max_attempts": 1,
                            "steps": [self.exec_step(ESCAPE_STEP + ESCAPES[how], d)]})
            gc = self.pid_of(f"{d}/pid.gc")
            step = self.pid_of(f"{d}/pid.step")
            self.pid_of(f"{d}/supervisor")
            wait_until(lambda: written(f"{d}/ticks.gc"), what="the escaped ticker's first tick")
            task = self.ended(c, task_id, 60)
            ended = time.time()
            left = [(name, pid) for name, pid in (("the step", step), ("its ticker", gc))
                    if alive(pid)]
            size = len(written(f"{d}/ticks.gc"))
            # Deliberately a second (20 ticks' time): the file must not grow.
            time.sleep(1.0)
            grew = len(written(f"{d}/ticks.gc")) - size
            late = [t - ended for t in times(f"{d}/ticks.gc") if t > ended]
            seen = (f"{how}: task {state(task)} {history(task)}; alive after it ended: {left}; "
                    f"{grew} bytes of ticks in the second after, {len(late)} ticks after it ended")
            self.assertFalse(left, seen)
            self.assertEqual(grew, 0, seen)
            self.assertFalse(late, seen)
            print(f"\n[one_copy] {case} escape by {how} ({' '.join(flags) or 'default flags'}): "
                  f"task {state(task)}, nothing alive after, no tick after", flush=True)

    def test_3a_setsid_child_goes_with_its_step(self):
        self.escape("3a", "setsid", CONFINE_OFF)

    def test_3b_double_forked_child_goes_with_its_step(self):
        self.escape("3b", "double-fork", CONFINE_OFF)

    def test_3c_a_step_that_kills_its_supervisor_leaves_nothing_running(self):
        self.escape("3c", "kill-supervisor", CONFINE_OFF)

    def test_3c_confined_a_step_that_kills_its_supervisor_leaves_nothing_running(self):
        self.escape("3c-confined", "kill-supervisor", [])

    def test_3d_double_fork_and_kill_supervisor_leaves_nothing_running(self):
        self.escape("3d", "double-fork-kill-supervisor", CONFINE_OFF)

    def test_3e_attempt_1_never_writes_beside_attempt_2(self):
        with self.cluster(FAST) as c:
            c.start_scheduler()
            self.agent(c, "one-file-3e", flags=["--kill_grace=1s"] + CONFINE_OFF)
            d = c.steps
            self.submit(c, {"id": "one-file-3e", "queue": "one-copy-3e", "max_attempts": 2,
                            "retry": QUICK_RETRY, "steps": [self.exec_step(ONE_FILE, d)]})
            writer = self.pid_of(f"{d}/pid.writer")
            self.pid_of(f"{d}/supervisor.1")
            task = self.ended(c, "one-file-3e", 60)
            ended = time.time()
            writer_alive = alive(writer)
            size = len(written(f"{d}/lines"))
            # Deliberately a second (20 lines' time): the file must not grow.
            time.sleep(1.0)
            grew = len(written(f"{d}/lines")) - size
            lines = [line.split() for line in written(f"{d}/lines").splitlines()]
            firsts = [i for i, line in enumerate(lines) if line[1] != "1"]
            self.assertTrue(firsts, f"no attempt 2 wrote: {history(task)}")
            after = [line for line in lines[firsts[0]:] if line[1] == "1"]
            self.assertEqual(len(after), 0,
                             f"lines of attempt 1 after attempt 2's first (of {len(lines)}; "
                             f"writer alive after the task ended: {writer_alive}, {grew} bytes "
                             f"written in the second after); task {state(task)} {history(task)}")
            self.assertFalse(writer_alive, "attempt 1's writer outlived the task")
            self.assertEqual(grew, 0, f"{grew} bytes written after the task ended")
            print(f"\n[one_copy] 3e attempt 1 kills its supervisor leaving a writer: "
                  f"{len(lines)} lines, none of attempt 1 after attempt 2's first; task "
                  f"{state(task)} {history(task)}", flush=True)

    # --- 4. a step that stops its supervisor -----------------------------------

    def stopped_supervisor(self, case, cancel):
        with self.cluster(FAST) as c:
            c.start_scheduler()
            agent_id = f"stopped-{case}"
            self.agent(c, agent_id, flags=["--kill_grace=1s"] + CONFINE_OFF)
            d = c.steps
            task_id = f"stops-supervisor-{case}"
            self.submit(c, {"id": task_id, "queue": f"one-copy-{case}", "max_attempts": 1,
                            "steps": [self.exec_step(STOPPER, d, None if cancel else "3s")]})
            supervisor = self.pid_of(f"{d}/supervisor")
            sleeper = self.pid_of(f"{d}/pid.sleep")
            self.pid_of(f"{d}/pid.step")
            try:
                wait_until(lambda: proc_state(supervisor) == "T", timeout=5,
                           what="the step's parent to stop")
                how = "SIGSTOPs its supervisor"
            except TimeoutError:  # it could not: what must hold holds all the same
                how = "tries to SIGSTOP its supervisor (it did not stop)"
            stopped = time.time()
            if cancel:
                c.wait_state(task_id, ["RUNNING"])
                c.ctl("cancel", task_id, check=True)
            expected = "CANCELLED" if cancel else "FAILED"
            # The step timeout (3 s, none when cancelled), the kill grace
            # (1 s) and 10 s for a slow machine.
            bound = (0 if cancel else 3) + 1 + 10
            task = self.ended(c, task_id, bound, seen=lambda: (
                f"its supervisor's stop {time.time() - stopped:.1f} s ago (state now "
                f"{proc_state(supervisor)!r}), the sleep 3000 alive: {alive(sleeper)}"))
            took = time.time() - stopped
            self.assertEqual(state(task), expected, history(task))
            wait_until(lambda: not alive(sleeper), timeout=5, what="the sleep 3000 to go")
            # The agent's one slot is free again.
            self.submit(c, {"id": f"after-{case}", "queue": f"one-copy-{case}",
                            "steps": [{"exec": {"argv": ["true"]}}]})
            after = self.ended(c, f"after-{case}", 30)
            self.assertEqual(state(after), "SUCCEEDED", history(after))
            self.assertEqual(after["attempts"][-1]["agent_id"], agent_id)
            print(f"\n[one_copy] {case} a step that {how} "
                  f"({'cancelled' if cancel else 'step timeout 3s'}): {expected} "
                  f"{took:.1f} s after the stop, the sleep gone, the slot free", flush=True)

    def test_4a_a_step_that_stops_its_supervisor_ends_at_its_timeout(self):
        self.stopped_supervisor("4a", cancel=False)

    def test_4b_a_step_that_stops_its_supervisor_can_be_cancelled(self):
        self.stopped_supervisor("4b", cancel=True)

    # --- 5. kept steps and other processes of the user ------------------------

    def hijack_kept_step(self, case, flags):
        with self.cluster(FAST + ["--reconnect_grace=1s"]) as c:
            c.start_scheduler()
            agent_id = f"kept-{case}"
            agent_flags = ["--keep_steps=30s",
                           f"--work_dir={os.path.join(c.dir, 'work-' + agent_id)}"] + flags
            agent = self.agent(c, agent_id, flags=agent_flags)
            d = c.steps
            task_id = f"hijacked-{case}"
            before = set(step_sockets())
            self.submit(c, {"id": task_id, "queue": f"one-copy-{case}", "max_attempts": 1,
                            "steps": [self.exec_step(PRINTING, d)]})
            step = self.pid_of(f"{d}/pid.1")
            wait_until(lambda: written(f"{d}/expected").count("\n") >= 3,
                       what="the step's first lines")
            agent.signal(signal.SIGTERM)
            self.assertEqual(agent.proc.wait(timeout=30), 0, agent.log()[-3000:])
            self.assertTrue(alive(step), "the kept step went with its agent")

            def ours(name):
                # New since the step started, and a name that carries a pid
                # (taskgrid-step-PID-...) carries our agent's.
                parts = name.split("-")
                return name not in before and (
                    len(parts) < 4 or not parts[2].isdigit() or parts[2] == str(agent.pid))

            def new_sockets():
                return {n: t for n, t in step_sockets().items() if ours(n)}
            try:
                found = wait_until(new_sockets, timeout=5, what="a kept step's socket")
            except TimeoutError:
                found = {}  # not listed where another process finds it: nothing to try
            tried = {name: hijack(name, t) for name, t in found.items()}
            self.assertTrue(alive(step), "the kept step went when another process connected")

            self.agent(c, agent_id, flags=agent_flags)
            open(f"{d}/go", "w").close()
            task = self.ended(c, task_id, 60, fail=False)
            read_by_others = {n: f"{len(got)} bytes: {got[:120]!r}..."
                              for n, (_, got) in tried.items() if got}
            self.assertFalse(read_by_others,
                             f"another process of the user read a kept step's output (the "
                             f"task then: {state(task)} {history(task)})")
            self.assertEqual(state(task), "SUCCEEDED", history(task))
            self.assertEqual(task["attempt"], 1, history(task))
            self.assertEqual(len(task["attempts"]), 1, history(task))
            self.assertEqual(b64(task["result"].get("stdout_tail")), written(f"{d}/expected"))
            self.assertEqual(b64(task["result"].get("output")), "output 5\n")
            print(f"\n[one_copy] {case} kept step ({' '.join(flags) or 'default flags'}): "
                  f"{len(found)} socket(s) found, "
                  f"{sum(1 for ok, _ in tried.values() if ok)} connected, nothing read; "
                  f"taken back, SUCCEEDED as attempt 1 with all its output", flush=True)

    def test_5a_no_other_process_reads_a_kept_step(self):
        self.hijack_kept_step("5a", CONFINE_OFF)

    def test_5a_confined_no_other_process_reads_a_kept_step(self):
        self.hijack_kept_step("5a-confined", [])

    def test_5b_a_kept_step_whose_supervisor_does_not_answer_dies_before_the_retry(self):
        with self.cluster(FAST + ["--reconnect_grace=1s"]) as c:
            c.start_scheduler()
            agent_id = "kept-5b"
            agent_flags = ["--keep_steps=10s", "--kill_grace=1s",
                           f"--work_dir={os.path.join(c.dir, 'work-' + agent_id)}"] + CONFINE_OFF
            agent = self.agent(c, agent_id, slots=2, flags=agent_flags)
            d = c.steps
            before = set(step_sockets())
            self.submit(c, {"id": "unanswered-5b", "queue": "one-copy-5b", "max_attempts": 1,
                            "steps": [self.exec_step(TICK_THEN_QUICK, d)]})
            wait_until(lambda: written(f"{d}/ticks.1"), what="attempt 1's first tick")
            step = self.pid_of(f"{d}/pid.1")
            agent.signal(signal.SIGTERM)
            self.assertEqual(agent.proc.wait(timeout=30), 0, agent.log()[-3000:])
            self.assertTrue(alive(step), "the kept step went with its agent")
            supervisor = parent(step)
            self.assertIn("taskgrid-step-supervisor", cmdline(supervisor))
            self.pids.append(supervisor)
            try:  # stopped once it listens for the next agent, where it can be found
                wait_until(lambda: [n for n in step_sockets() if n not in before], timeout=5,
                           what="the kept step's socket")
            except TimeoutError:
                pass
            os.kill(supervisor, signal.SIGSTOP)
            wait_until(lambda: proc_state(supervisor) == "T", what="the supervisor to stop")
            back = time.time()

            self.agent(c, agent_id, slots=2, flags=agent_flags)
            task = self.ended(c, "unanswered-5b", 45, seen=lambda: (
                f"attempt 1's step alive: {alive(step)}, {len(times(f'{d}/ticks.1'))} ticks, "
                f"the last {time.time() - times(f'{d}/ticks.1')[-1]:.1f} s ago"))
            later = started(d)[1:]
            start2 = [float(written(f"{d}/start.{n}")) for n in later]
            last1 = times(f"{d}/ticks.1")[-1]
            when = (f"attempt 1's last tick at {last1 - back:+.1f} s from the agent's return, "
                    f"the next attempt ({later[:1]}) started at "
                    f"{[round(s - back, 1) for s in start2[:1]]}, attempt 1's step alive: "
                    f"{alive(step)}")
            self.assertTrue(start2, f"no attempt after 1: {history(task)}; {when}")
            self.assertLess(last1, start2[0],
                            "the next attempt started while attempt 1 ran: " + when)
            self.assertFalse(alive(step), "the kept step outlived its attempt: " + when)
            self.assertEqual(state(task), "SUCCEEDED", history(task))
            self.assertEqual(task["attempts"][0]["attempt"], 1, history(task))
            self.assertTrue(task["attempts"][0].get("interrupted"), history(task))
            print(f"\n[one_copy] 5b kept step, supervisor stopped while its agent was away: "
                  f"{when}; {history(task)}", flush=True)

    # --- 6. a result through a scheduler outage and an agent restart ----------

    def result_through_outage(self, case, kill_agent):
        with self.cluster(FAST + ["--restart_grace=60s"]) as c:
            c.start_scheduler()
            agent_id = f"holder-{case}"
            work = f"--work_dir={os.path.join(c.dir, 'work-' + agent_id)}"
            agent = self.agent(c, agent_id, flags=[work])
            d = c.steps
            task_id = f"outage-result-{case}"
            self.submit(c, {"id": task_id, "queue": f"one-copy-{case}", "max_attempts": 1,
                            "steps": [self.exec_step(AFTER_GO, d)]})
            self.pid_of(f"{d}/pid.1")
            supervisor = self.pid_of(f"{d}/supervisor.1")
            c.wait_state(task_id, ["RUNNING"])
            c.scheduler.kill9()
            open(f"{d}/go", "w").close()
            wait_until(lambda: written(f"{d}/done.1"), what="the step's done marker")
            # Reaped by the agent, which collected the result then.
            wait_until(lambda: not os.path.exists(f"/proc/{supervisor}"),
                       what="the step's supervisor to be reaped")
            # The agent holds the result it collected (its log says so).
            wait_until(lambda: f"{task_id} attempt 1 finished" in agent.log(),
                       what="the agent to collect the result")
            if kill_agent:
                agent.kill9()
            else:
                agent.signal(signal.SIGTERM)
                agent.proc.wait(timeout=60)
            self.agent(c, agent_id, flags=[work], wait=False)
            c.start_scheduler()
            task = self.ended(c, task_id, 60)
            return c, task

    def test_6a_a_result_from_an_outage_survives_an_agent_restart(self):
        c, task = self.result_through_outage("6a", kill_agent=False)
        self.assertEqual(state(task), "SUCCEEDED", history(task))
        self.assertEqual(task["attempt"], 1, history(task))
        self.assertEqual(len(task["attempts"]), 1, history(task))
        self.assertEqual(b64(task["result"].get("output")), "output 1\n")
        self.assertEqual(b64(task["result"].get("stdout_tail")), "stdout 1\n")
        print(f"\n[one_copy] 6a result collected while the scheduler was down, agent "
              f"SIGTERMed and back, scheduler back: SUCCEEDED as attempt 1 with its output",
              flush=True)

    def test_6b_a_result_lost_with_a_killed_agent_is_not_counted(self):
        c, task = self.result_through_outage("6b", kill_agent=True)
        self.assertEqual(state(task), "SUCCEEDED", history(task))
        self.assertEqual(task["attempt"], 2, history(task))
        first = task["attempts"][0]
        self.assertEqual(first["attempt"], 1, history(task))
        self.assertTrue(first.get("interrupted"), history(task))
        self.assertEqual(b64(task["result"].get("output")), "output 2\n")
        print(f"\n[one_copy] 6b result collected while the scheduler was down, agent killed "
              f"(-9) and back: attempt 1 not counted, SUCCEEDED as attempt 2 of "
              f"max_attempts 1: {history(task)}", flush=True)

    # --- 7. a chain's results resent out of order -----------------------------

    def test_7_a_chain_finishes_when_its_results_come_back_out_of_order(self):
        with self.cluster(FAST) as c:
            c.start_scheduler()
            self.agent(c, "etl-7")
            d = c.steps
            transform = r"""
            i=0; while [ ! -e "$1/go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
            echo "rows 7" > "$TASKGRID_OUTPUT"
            """
            load = r"""
            cat "$TASKGRID_INPUTS_DIR/etl7-b-transform" > "$1/loaded"
            echo $PPID > "$1/load.supervisor"; date +%s.%N > "$1/load.done"
            """
            # Ids that sort the link (load) before its predecessor.
            job = {"job_id": "etl-job-7", "tasks": [
                {"id": "etl7-b-transform", "queue": "one-copy-7",
                 "steps": [self.exec_step(transform, d)]},
                {"id": "etl7-a-load", "queue": "one-copy-7", "depends_on": ["etl7-b-transform"],
                 "steps": [self.exec_step(load, d)]}]}
            c.ctl("job", "submit", "-", input=json.dumps(job), check=True)
            c.wait_state("etl7-b-transform", ["RUNNING"])
            link = c.wait_state("etl7-a-load", ["DISPATCHED"])
            self.assertEqual(link["agent_id"], "etl-7", "load was not sent along as a link")
            c.scheduler.kill9()
            open(f"{d}/go", "w").close()
            wait_until(lambda: written(f"{d}/load.done"), what="load to run")
            supervisor = int(written(f"{d}/load.supervisor"))
            wait_until(lambda: not os.path.exists(f"/proc/{supervisor}"),
                       what="load's supervisor to be reaped")
            c.start_scheduler()
            ids = ("etl7-b-transform", "etl7-a-load")
            try:
                wait_until(lambda: all(state(c.task(t)) in ENDED for t in ids), timeout=30,
                           interval=0.1, what="both tasks to end")
            except TimeoutError as e:
                self.fail(f"{e}: " + "; ".join(
                    f"{t} {state(c.task(t))} (attempt {c.task(t)['attempt']}, "
                    f"{c.task(t)['reason']})" for t in ids))
            for task_id in ids:
                task = c.task(task_id)
                self.assertEqual(state(task), "SUCCEEDED", f"{task_id}: {history(task)}")
                self.assertEqual(task["attempt"], 1, f"{task_id}: {history(task)}")
                self.assertEqual(len(task["attempts"]), 1, f"{task_id}: {history(task)}")
            self.assertEqual(written(f"{d}/loaded"), "rows 7\n")
            def job_state():
                # `job get --json`: the Job on the first line, then its tasks.
                res = c.ctl("--json", "job", "get", "etl-job-7", check=True)
                return json.loads(res.stdout.splitlines()[0]).get("state", "")
            ended_job = wait_until(lambda: job_state().endswith(
                ("SUCCEEDED", "FAILED", "CANCELLED")) and job_state(), what="the job to end")
            self.assertEqual(ended_job, "JOB_STATE_SUCCEEDED")
            # The link's slot is free: the one-slot agent takes the next task.
            self.submit(c, {"id": "after-7", "queue": "one-copy-7",
                            "steps": [{"exec": {"argv": ["true"]}}]})
            after = self.ended(c, "after-7", 30)
            self.assertEqual(state(after), "SUCCEEDED", history(after))
            print("\n[one_copy] 7 chain transform -> load finished while the scheduler was "
                  "down, results resent after its restart: both SUCCEEDED as attempt 1, the "
                  "job SUCCEEDED, the slot free", flush=True)

    # --- 8. schedule_timeout while DISPATCHED ---------------------------------

    def expires_while_dispatched(self, case, restart):
        with self.cluster(FAST + ["--reconnect_grace=1s"]) as c:
            c.start_scheduler()
            frozen = self.agent(c, f"frozen-{case}")
            d = c.steps
            frozen.signal(signal.SIGSTOP)
            self.pids.append(frozen.pid)
            task_id = f"expires-dispatched-{case}"
            self.submit(c, {"id": task_id, "queue": f"one-copy-{case}", "schedule_timeout": "3s",
                            "steps": [self.exec_step(
                                r'date +%s.%N > "$1/ran.$TASKGRID_ATTEMPT"', d)]})
            task = c.wait_state(task_id, ["DISPATCHED"], timeout=10)
            self.assertEqual(task["agent_id"], f"frozen-{case}")
            created = unix_time(task["create_time"])
            if restart:
                c.scheduler.kill9()
                c.start_scheduler(extra_flags=["--restart_grace=4s"])
            # Deliberately past the start deadline (create time + 3 s).
            wait_until(lambda: time.time() > created + 3.5, what="the start deadline to pass")
            self.agent(c, f"other-{case}")
            # A stays frozen to the end (tearDown kills it): continued, it
            # would read the Assign waiting in its socket and might start
            # the step before it learns the attempt is gone.
            task = self.ended(c, task_id, 40)
            ran = {f: float(written(os.path.join(d, f))) - created
                   for f in os.listdir(d) if f.startswith("ran.")}
            self.assertFalse(ran, f"it ran (seconds after its create time; its start deadline "
                                  f"+3 s): {ran}; {history(task)}")
            self.assertEqual(state(task), "FAILED", history(task))
            self.assertFalse([a for a in task["attempts"] if a.get("agent_id") == f"other-{case}"],
                             history(task))
            print(f"\n[one_copy] {case} schedule_timeout 3s while DISPATCHED to a frozen agent"
                  f"{' across a scheduler restart' if restart else ''}: FAILED "
                  f"{unix_time(task['update_time']) - created:.1f} s after submit, never run",
                  flush=True)

    def test_8a_schedule_timeout_passes_while_dispatched_to_a_frozen_agent(self):
        self.expires_while_dispatched("8a", restart=False)

    def test_8b_schedule_timeout_passes_while_dispatched_across_a_restart(self):
        self.expires_while_dispatched("8b", restart=True)


if __name__ == "__main__":
    unittest.main()
