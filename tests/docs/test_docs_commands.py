"""Every shell block of README.md and docs/*.md runs as written, so the docs cannot drift (issue #17).

The rules, for whoever writes docs:
- A fenced block marked ```sh or ```bash holds commands. Each block is one test case (named by file and
  line) and runs on its own with bash (`-e -o pipefail`: any failing command fails the block), with the
  virtual environment's `bin` first on PATH, in a fresh directory that looks like the root of a fresh
  clone: it holds links to the checkout's tracked top-level entries and `.venv`. So `envpipe/...` and
  `.venv/bin/python` resolve, while outputs at relative paths (`plan.json`, `out/...`) land in that
  directory and vanish with it. A block passes when it exits 0, prints no Python traceback and leaves
  no process of its own running.
- A ```sh block that cannot run here (it needs a GPU, a cluster, a registry, CML) carries a one-line
  HTML comment right above its fence: `<!-- not run by tests: <why> -->`. The case is skipped with that
  reason (`pytest -rs` lists them all).
- A block that takes more than a few seconds carries `<!-- slow test: <why> -->` instead, which marks
  its case `slow`.
- Every fence names its language: ```text, ```json, ```python, ```yaml, ```console (sample output) and
  the like are not run, and a fence with no language fails here, so a command cannot hide in one.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from envpipe_launch.supervise import PR_SET_CHILD_SUBREAPER, set_prctl

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"sh", "bash"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>.*)$")
MARKER = re.compile(r"^\s*<!-- (?P<kind>not run by tests|slow test): (?P<why>\S.*?) -->\s*$")
ANY_MARKER = re.compile(r"^\s*<!--\s*(not run by tests|slow test)\b")
TIMEOUT_S = {"fast": 120, "slow": 1200}


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository root
    line: int  # line of the opening fence, 1-based
    lang: str  # first word of the info string, "" when there is none
    code: str
    marker: str | None  # "not run by tests" | "slow test" | None
    why: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def parse(text: str, doc: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of one Markdown text (named `doc`), and what is wrong with its fences and markers."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used_markers: set[int] = set()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = i + 1
        while end < len(lines) and not re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        if end == len(lines):
            problems.append(f"{doc}:{i + 1}: this fence is never closed")
        lang = opening["info"].split()[0].lower() if opening["info"].strip() else ""
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        if marker:
            used_markers.add(i - 1)
        code = "\n".join(line[indent:] if line[:indent].strip() == "" else line.lstrip() for line in lines[i + 1 : end])
        blocks.append(
            Block(doc, i + 1, lang, code, marker["kind"] if marker else None, marker["why"] if marker else "")
        )
        if not lang:
            problems.append(
                f"{doc}:{i + 1}: a fence with no language; write ```sh for commands (run by this test) "
                "or ```text, ```console, ```json ... for anything else"
            )
        elif marker and lang not in SHELLS:
            problems.append(f"{doc}:{i}: a test marker above a ```{lang} block, which is never run")
        i = end + 1
    for n, line in enumerate(lines):
        if ANY_MARKER.search(line) and n not in used_markers:
            problems.append(
                f"{doc}:{n + 1}: a test marker that is not the line right above a fence, or not of the form "
                "`<!-- not run by tests: <why> -->` / `<!-- slow test: <why> -->`"
            )
    return blocks, problems


def parse_doc(path: Path) -> tuple[list[Block], list[str]]:
    return parse(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())


def shell_blocks() -> list:
    params = []
    for path in DOCS:
        for block in parse_doc(path)[0]:
            if block.lang not in SHELLS:
                continue
            marks = []
            if block.marker == "not run by tests":
                marks.append(pytest.mark.skip(reason=f"{block.where}: not run: {block.why}"))
            elif block.marker == "slow test":
                marks.append(pytest.mark.slow)
            params.append(pytest.param(block, id=block.where, marks=marks))
    return params


def fresh_clone_view(workdir: Path) -> None:
    """Links to what a fresh clone's root holds: the tracked top-level entries, .git and .venv."""
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True, check=False
    ).stdout
    names = {entry.split("/", 1)[0] for entry in tracked.split("\0") if entry}
    if not names:  # not a git checkout (an unpacked archive): everything there is
        names = {p.name for p in ROOT.iterdir()}
    names |= {".git", ".venv"}
    for name in sorted(names):
        if (ROOT / name).exists():
            (workdir / name).symlink_to(ROOT / name)


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """While inside, this process adopts the orphans of its descendants (Linux's child subreaper).

    A block's process that left its session (setsid, a daemon's double fork) still ends up a child of
    ours, whatever it is doing: scanning /proc for an inherited tag misses a process in the middle of an
    exec, whose environment reads empty until the new program's is in place (it did, on a loaded CI host).
    """
    if not set_prctl(PR_SET_CHILD_SUBREAPER, 1):
        raise OSError("prctl(PR_SET_CHILD_SUBREAPER) failed: cannot catch what a block leaves behind")
    try:
        yield
    finally:
        set_prctl(PR_SET_CHILD_SUBREAPER, 0)


def descendants() -> set[psutil.Process]:
    """This process's descendants (psutil.Process compares by pid and start time, so a reused pid differs)."""
    return set(psutil.Process().children(recursive=True))


def still_running(adopted: set[psutil.Process]) -> list[psutil.Process]:
    """The block's processes that still run. Those that already ended are our zombies now (we adopted them):
    reaped here, not counted (short-lived daemons of the deploy tests double-fork and exit)."""
    running = []
    for proc in adopted:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                running.append(proc)
            elif proc.ppid() == os.getpid():
                os.waitpid(proc.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            continue
    return running


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


@dataclass(frozen=True)
class Run:
    returncode: int
    timed_out: bool
    left_running: int  # processes of the block still running after it ended (now killed)
    stdout: str
    stderr: str


def run_block(block: Block, tmp_path: Path, timeout_s: float) -> Run:
    """Run a block as a user would from a fresh clone's root; stop whatever it leaves behind."""
    root = tmp_path / "root"
    root.mkdir(parents=True)
    fresh_clone_view(root)
    env = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)  # a user's shell has none; the venv's editable install finds the package
    # Output goes to files, not pipes: a process that outlives the block cannot hold the test up.
    with open(tmp_path / "stdout", "w+") as out, open(tmp_path / "stderr", "w+") as err, adopting_orphans():
        ours = descendants()  # the tests' own helpers, running before the block starts
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        left = still_running(descendants() - ours)
        kill_all(left)
        out.seek(0)
        err.seek(0)
        return Run(proc.returncode, timed_out, len(left), out.read(), err.read())


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_fences_name_their_language(path: Path) -> None:
    problems = parse_doc(path)[1]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", shell_blocks())
def test_shell_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    timeout = TIMEOUT_S["slow" if block.marker == "slow test" else "fast"]
    run = run_block(block, tmp_path, timeout)
    report = f"\n--- commands\n{block.code}\n--- stdout (end)\n{tail(run.stdout)}\n--- stderr (end)\n{tail(run.stderr)}"
    assert not run.timed_out, f"{block.where}: still running after {timeout} s (killed){report}"
    assert run.returncode == 0, f"{block.where}: exit status {run.returncode}{report}"
    traceback = "Traceback (most recent call last)" in run.stdout + run.stderr
    assert not traceback, f"{block.where}: printed a traceback{report}"
    assert not run.left_running, f"{block.where}: left {run.left_running} process(es) running (killed){report}"


# The checker itself, on made-up docs: what it finds, and that nothing a block starts escapes it.

SAMPLE = """# doc
```
unlabelled
```
<!-- not run by tests: needs a cluster -->
```sh
kubectl apply -f job.yaml
```
<!-- slow test: about a minute -->
```bash
echo slow
```
<!-- not run by tests: not a shell block -->
```python
print(1)
```
- a list item:
  ~~~sh
  echo "indented" \\
    --flag
  ~~~
<!-- not run by tests: nothing below -->

text `<!-- not run by tests: x -->` in prose is no marker
"""


def test_parser_on_a_sample() -> None:
    blocks, problems = parse(SAMPLE, "s.md")
    assert [(b.line, b.lang, b.marker, b.why) for b in blocks] == [
        (2, "", None, ""),
        (6, "sh", "not run by tests", "needs a cluster"),
        (10, "bash", "slow test", "about a minute"),
        (14, "python", "not run by tests", "not a shell block"),
        (18, "sh", None, ""),
    ]
    assert blocks[4].code == 'echo "indented" \\\n  --flag'
    assert [p.split(": ", 1)[0] for p in problems] == ["s.md:2", "s.md:13", "s.md:22"]


def test_runner_stops_what_a_block_leaves_behind(tmp_path: Path) -> None:
    escaped = Block("s.md", 1, "sh", "setsid sleep 61 > /dev/null 2>&1 < /dev/null &\necho started", None, "")
    run = run_block(escaped, tmp_path / "a", timeout_s=60)
    assert (run.returncode, run.timed_out, run.left_running, run.stdout) == (0, False, 1, "started\n")
    assert not processes_named("sleep 61")
    # A daemon's double fork, the orphan caught in its exec: still found, however slow the host.
    daemon = Block("s.md", 1, "sh", "(setsid bash -c 'exec sleep 62' &) ; echo started", None, "")
    run = run_block(daemon, tmp_path / "b", timeout_s=60)
    assert (run.returncode, run.left_running) == (0, 1)
    assert not processes_named("sleep 62")
    # An orphan that already ended is no leftover: adopted, it is our zombie, reaped and not counted.
    ended = Block("s.md", 1, "sh", "(sh -c 'exit 0' &) ; sleep 0.5", None, "")
    run = run_block(ended, tmp_path / "z", timeout_s=60)
    assert (run.returncode, run.left_running) == (0, 0)
    assert not [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    hung = Block("s.md", 1, "sh", "sleep 63", None, "")
    run = run_block(hung, tmp_path / "c", timeout_s=0.5)
    assert run.timed_out and not run.left_running
    assert not processes_named("sleep 63")


def processes_named(cmdline: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) == cmdline]
