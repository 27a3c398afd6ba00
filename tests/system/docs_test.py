"""The guide's examples, run: every ```console block of README.md and
docs/*.md, in order per page, against a scheduler and an agent of the
page's own. A page whose example no longer does what the page shows fails.

A console block is what a terminal shows:

    ```console
    $ taskgridctl submit --id hello -- /bin/echo hi
    hello  default  PENDING
    $ taskgridctl wait hello
    hello SUCCEEDED
    ```

- A line starting with "$ " is a command; one ending in a backslash goes on
  to the next line, and a here-document (<<'END') to its end line. The commands of a page run in order in one bash, so an
  `export` or a `cd` holds for the rest of the page.
- The lines after a command are what it prints (stdout and stderr
  together). "..." alone on a line stands for any number of lines, and
  "..." within a line for any text (ids, times, durations). A command with
  no lines after it may print anything.
- A command must exit 0, unless its last shown line is "[exit N]".

Each page gets what the quick start (deploy/quickstart.sh) runs: a
scheduler (its own data directory, gRPC and HTTP ports; the `taskgridctl`
and binaries on PATH, $TASKGRID_ADDR set) and one agent, `local-agent`,
with 2 slots. It runs in a temporary directory that holds a copy of
examples/ and deploy/ (a link), as the repository does. The quick start's
addresses in a command, 127.0.0.1:7070 (gRPC) and 127.0.0.1:7080 (HTTP),
stand for the page's own, and the page's own in what a command prints
read as the quick start's.

Not console blocks, so not run here: the commands of a machine's set-up
(installing packages, building, systemd units, root's files), which
system.production_walkthrough runs from deploy/'s own files; a PostgreSQL
server's set-up, which system.postgres runs with a server of its own; the
Python and TypeScript packages' installs and examples, which
system.python_package, system.python_client and system.typescript_client
run; grpcurl's calls (Debian has no grpcurl; the page's `buf curl` calls
are the same requests, run here with deploy/install-buf.sh's buf, named by
$TASKGRID_BUF); the quick start itself and its restart of a killed
scheduler (README.md), which system.quickstart runs with the build's
binaries; and the benchmark's hour-long workloads (tools/bench runs them,
docs/performance.md shows the results).

Run through ctest (system.docs), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set; TASKGRID_DOCS_PAGES=docs/jobs.md runs
one page.
"""
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import binary  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
COMMAND_TIMEOUT = 60.0
MARK = "__taskgrid_docs_test_done__"


def pages():
    """README.md and docs/*.md; only those named in $TASKGRID_DOCS_PAGES
    (comma-separated, relative to the repository) when it is set."""
    found = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    found += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    only = [p for p in os.environ.get("TASKGRID_DOCS_PAGES", "").split(",") if p]
    if only:
        found = [p for p in found if os.path.relpath(p, ROOT) in only]
    return found


def examples(text):
    """[(line number, command, [shown lines])] of the page's console blocks, in order."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            if not line.startswith("$ "):
                raise ValueError(f"line {i + 1}: a console block starts with a command ($ ...)")
            start = i + 1
            command = line[2:]
            while command.endswith("\\"):
                i += 1
                command += "\n" + lines[i]
            heredoc = re.search(r"<<-?'?(\w+)'?", command)
            if heredoc:
                while lines[i] != heredoc.group(1):
                    i += 1
                    command += "\n" + lines[i]
            i += 1
            shown = []
            while i < len(lines) and lines[i].strip() != "```" and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            out.append((start, command, shown))
        i += 1
    return out


def line_pattern(shown):
    parts = [re.escape(p) for p in shown.rstrip().split("...")]
    return re.compile(".*".join(parts) + r"\Z")


def matches(shown, printed):
    """Whether `printed` (lines) is what `shown` (lines, with "..." wildcards) says."""
    shown = [s.rstrip() for s in shown]
    printed = [p.rstrip() for p in printed]

    def at(si, pi):
        if si == len(shown):
            return pi == len(printed)
        if shown[si] == "...":
            return any(at(si + 1, k) for k in range(pi, len(printed) + 1))
        return (pi < len(printed) and line_pattern(shown[si]).match(printed[pi]) is not None and
                at(si + 1, pi + 1))
    return at(0, 0)


def swap(text, addresses):
    """`text` with each address that is a key of `addresses` replaced by its value."""
    return re.sub("|".join(map(re.escape, addresses)), lambda m: addresses[m.group(0)], text)


class Shell:
    """One bash for a page: commands run in order, each one's output to a file."""

    def __init__(self, cwd, env):
        self.dir = cwd
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.n = 0

    def run(self, command):
        """(exit status, printed lines) of `command`."""
        self.n += 1
        out = os.path.join(self.dir, f".out-{self.n}")
        self.proc.stdin.write(f"{{\n{command}\n}} > {out} 2>&1 < /dev/null\n"
                              f"echo {MARK} $?\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + COMMAND_TIMEOUT
        line = ""
        while not line.startswith(MARK):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise TimeoutError(f"no end within {COMMAND_TIMEOUT}s")
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the shell ended (bash leaves on a syntax error: a line "
                                   "that goes on to the next must end in a backslash)")
        with open(out, errors="replace") as f:
            printed = f.read()
        if printed.endswith("\n"):
            printed = printed[:-1]
        return int(line.split()[1]), (printed.split("\n") if printed else [])

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc.stdin.close()
        self.proc.stdout.close()


class DocsTest(unittest.TestCase):

    def test_console_blocks_parse(self):
        """The parser and matcher themselves, on a page made up here."""
        page = ("x\n```console\n$ echo a \\\n  b\na b\n$ true\n$ false\n[exit 1]\n"
                "$ cat <<'END'\n$ x\nEND\n$ x\n```\n```bash\n$ not run\n```\n")
        self.assertEqual(examples(page), [(3, "echo a \\\n  b", ["a b"]), (6, "true", []),
                                          (7, "false", ["[exit 1]"]),
                                          (9, "cat <<'END'\n$ x\nEND", []), (12, "x", [])])
        self.assertTrue(matches(["id t...-... PENDING", "..."], ["id t1-2 PENDING", "x", "y"]))
        self.assertTrue(matches(["a", "...", "z"], ["a", "z"]))
        self.assertFalse(matches(["a", "...", "z"], ["a", "y"]))
        self.assertFalse(matches(["hello SUCCEEDED"], ["hello FAILED"]))
        self.assertFalse(matches(["a"], ["a", "b"]))
        self.assertFalse(matches(["a (b)"], ["a b"]))
        ours = {"127.0.0.1:7070": "127.0.0.1:41234", "127.0.0.1:7080": "127.0.0.1:41235"}
        self.assertEqual(swap("curl 127.0.0.1:7080/x --addr=127.0.0.1:7070", ours),
                         "curl 127.0.0.1:41235/x --addr=127.0.0.1:41234")

    def test_shell_runs_a_continued_command_as_one(self):
        """A command continued with a backslash runs as one command, and a
        page's shell keeps its variables from one command to the next."""
        work = tempfile.mkdtemp(prefix="taskgrid-docs-shell-")
        shell = Shell(work, dict(os.environ))
        try:
            [(_, command, shown)] = examples("```console\n$ echo a \\\n  b\na b\n```\n")
            self.assertEqual(shell.run(command), (0, shown))
            self.assertEqual(shell.run("x=1"), (0, []))
            self.assertEqual(shell.run("echo $x; exit_with() { return $1; }; exit_with 3"),
                             (3, ["1"]))
        finally:
            shell.close()
            shutil.rmtree(work, ignore_errors=True)

    def test_every_link_between_pages_resolves(self):
        """Each relative link of README.md and docs/*.md names a file that
        exists, and a heading of it when it has an #anchor."""
        def anchors(path):
            with open(path, encoding="utf-8") as f:
                text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
            return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.*)$", text, re.M)}
        broken = []
        for path in pages():
            with open(path, encoding="utf-8") as f:
                text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, https:, mailto:
                file, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(full):
                    broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such file)")
                elif anchor and full.endswith(".md") and anchor not in anchors(full):
                    broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such heading)")
        self.assertEqual(broken, [])

    def test_no_two_pages_submit_one_id_differently(self):
        """A reader who follows the pages one after another on one scheduler
        must not meet ALREADY_EXISTS: a task id that two pages submit is
        submitted by the same command on both (a submit of the same spec is
        answered with the task)."""
        submits = {}  # id: {command: page}
        for path in pages():
            with open(path, encoding="utf-8") as f:
                page = examples(f.read())
            for _, command, _ in page:
                if "taskgridctl submit" not in command and '"id"' not in command:
                    continue
                for task_id in re.findall(r'--id[= ]([\w:.-]+)|"id": ?"([\w:.-]+)"', command):
                    task_id = task_id[0] or task_id[1]
                    spec = re.sub(r" --wait(_timeout=\S+)?\b", "", command)  # not the spec
                    submits.setdefault(task_id, {})[spec] = os.path.relpath(path, ROOT)
        clashes = {task_id: sorted(set(by.values())) for task_id, by in submits.items()
                   if len(by) > 1 and len(set(by.values())) > 1}
        self.assertEqual(clashes, {})

    def test_every_page_runs_as_shown(self):
        ran = 0
        for path in pages():
            with open(path, encoding="utf-8") as f:
                page = examples(f.read())
            if not page:
                continue
            name = os.path.relpath(path, ROOT)
            ran += len(page)
            with self.subTest(page=name):
                self.run_page(name, page)
        self.assertGreater(ran, 0, "no console block found")

    def run_page(self, name, page):
        with harness.Cluster() as cluster:
            http_port = cluster.start_with_http()
            cluster.start_agent("local-agent", slots=2)  # as deploy/quickstart.sh starts it
            addresses = {"127.0.0.1:7070": cluster.addr, "127.0.0.1:7080": f"127.0.0.1:{http_port}"}
            back = {ours: quick for quick, ours in addresses.items()}
            work = os.path.join(cluster.dir, "work")
            shutil.copytree(os.path.join(ROOT, "examples"), os.path.join(work, "examples"))
            os.symlink(os.path.join(ROOT, "deploy"), os.path.join(work, "deploy"))
            env = dict(os.environ)
            bins = {os.path.dirname(binary(b))
                    for b in ("TASKGRID_CTL", "TASKGRID_SCHEDULER", "TASKGRID_AGENT")}
            buf = os.environ.get("TASKGRID_BUF", "")
            if buf:  # deploy/install-buf.sh's, for the pages' `buf curl`
                bins.add(os.path.dirname(buf))
            env["PATH"] = os.pathsep.join(sorted(bins) + [env.get("PATH", "/usr/bin:/bin")])
            env["TASKGRID_ADDR"] = cluster.addr
            env["HOME"] = work
            env["TMPDIR"] = work  # agents a page starts work under it, not a shared /tmp
            env.pop("TASKGRID_TOKEN_FILE", None)
            shell = Shell(work, env)
            try:
                harness.wait_until(lambda: cluster.agents_info().get("local-agent"),
                                   what="the page's agent")
                for line, command, shown in page:
                    want_exit = 0
                    if shown and re.fullmatch(r"\[exit \d+\]", shown[-1].strip()):
                        want_exit = int(shown[-1].strip()[6:-1])
                        shown = shown[:-1]
                    status, printed = shell.run(swap(command, addresses))
                    printed = [swap(p, back) for p in printed]
                    where = f"{name}:{line}: $ {command}"
                    self.assertEqual(status, want_exit,
                                     f"{where}\nexited {status}, printed:\n" + "\n".join(printed))
                    if shown:
                        self.assertTrue(matches(shown, printed),
                                        f"{where}\nthe page shows:\n" + "\n".join(shown) +
                                        "\nit printed:\n" + "\n".join(printed))
            except Exception:
                cluster.dump_logs()
                raise
            finally:
                shell.close()


if __name__ == "__main__":
    unittest.main()
