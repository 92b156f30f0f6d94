"""`make demo`'s setup timed as a new user meets it (issue #27): `make demo-install` in a fresh clone of one
commit with empty pip and uv caches, each step's own line and the wall clock of the whole; then once more with
the caches the last run filled (a fresh clone, warm caches).

    python -m benchmarks.setup_time measure DIR [--commit REV] [--runs 2]   time it; one JSON per run in DIR
    python -m benchmarks.setup_time render DIR...                          print the Markdown of those runs

A run's JSON keeps make's whole output, the load average before and after, and what the venv holds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, machine_line, md_row, md_table, shown_path

TARGET_S = 90.0  # issue #27: setup from an empty cache
STEP = re.compile(r"^make: (.+) \.\.\. (\d+\.\d) s$", re.M)  # the Makefile's `step` macro
# What the venv holds, asked of its own interpreter after the setup.
DISTRIBUTIONS = ("import importlib.metadata as m, json; "
                 "print(json.dumps(sorted(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions())))")


def steps(output: str) -> list[tuple[str, float]]:
    """Each setup step's name and seconds, from make's progress lines."""
    return [(what, float(s)) for what, s in STEP.findall(output)]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def resolve(commit: str, prog: str = "setup_time") -> tuple[str, str]:
    """The commit's full hash and subject; one line (from ``prog``) if it is not a commit of this checkout."""
    try:
        return _git("rev-parse", "--verify", f"{commit}^{{commit}}"), _git("log", "-1", "--format=%s", commit)
    except subprocess.CalledProcessError:
        raise SystemExit(f"{prog}: {commit!r} is not a commit of {ROOT}") from None


def one_run(sha: str, caches: Path, cache: str, work: Path) -> dict[str, Any]:
    """`make demo-install` in a fresh clone of `sha` with the pip and uv caches under `caches`."""
    clone = Path(tempfile.mkdtemp(prefix="clone_", dir=work))
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", sha], check=True)
    env = {**os.environ, "MAKEFLAGS": "", "PIP_CACHE_DIR": str(caches / "pip"), "UV_CACHE_DIR": str(caches / "uv")}
    started, load_before = dt.datetime.now(dt.UTC), loadavg()
    t0 = time.monotonic()
    proc = subprocess.run(["make", "-s", "--no-print-directory", "demo-install"], cwd=clone, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    load_after = loadavg()
    venv_python = clone / ".venv" / "bin" / "python"
    packages = json.loads(subprocess.run([str(venv_python), "-c", DISTRIBUTIONS], capture_output=True, text=True,
                                         check=True).stdout) if proc.returncode == 0 else []
    return {"commit": sha, "subject": _git("log", "-1", "--format=%s", sha), "cache": cache,
            "started": f"{started:%Y-%m-%d %H:%M:%S} UTC", "machine": machine_line(),
            "load_before": load_before, "load_after": load_after, "wall_s": round(wall, 2),
            "returncode": proc.returncode, "output": proc.stdout + proc.stderr, "packages": packages}


def measure(out: Path, commit: str, runs: int) -> None:
    sha, _ = resolve(commit)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"setup_time: {out} is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="setup_time_") as tmp:
        work = Path(tmp)
        caches = work / "caches_0"
        for n in range(1, runs + 2):
            cache = "warm" if n == runs + 1 else "empty"
            if cache == "empty":  # new, empty caches; the warm run reuses the last run's
                caches = Path(tempfile.mkdtemp(prefix="caches_", dir=work))
            run = one_run(sha, caches, cache, work)
            (out / f"{n}_{cache}.json").write_text(json.dumps(run, indent=1) + "\n")
            print(f"run {n} ({cache} cache): {run['wall_s']:.1f} s, exit {run['returncode']}, "
                  f"load {run['load_before'][0]:.1f}")


# ---- the Markdown, from the raw JSON alone -----------------------------------------------------------------


def read_runs(folder: Path) -> list[dict[str, Any]]:
    files = sorted(folder.glob("*.json"), key=lambda p: int(p.name.split("_")[0]))
    if not files:
        raise SystemExit(f"setup_time: no run (N_empty.json, N_warm.json) in {folder}")
    return [json.loads(f.read_text()) for f in files]


def installed(run: dict[str, Any]) -> str:
    names = {p.split("==")[0].lower(): p.split("==")[1] for p in run["packages"]}
    cuda = sorted(n for n in names if n.startswith("nvidia-") and n != "nvidia-ml-py")  # NVML's bindings: no CUDA
    return (f"{len(names)} distributions, torch {names.get('torch', 'missing')}, "
            + (f"CUDA packages: {', '.join(cuda)}" if cuda else "no CUDA package"))


def render_folder(folder: Path) -> list[str]:
    runs = read_runs(folder)
    first = runs[0]
    names = [what for what, _ in steps(first["output"])]
    head = [f"run {n}, {r['cache']} cache" for n, r in enumerate(runs, 1)]
    lines = [f"## {folder.name}: the Makefile of commit {first['commit'][:9]}", "",
             f"Raw runs: `{shown_path(folder)}/`. Machine: {first['machine']}.", "",
             *md_table("", *head),
             md_row("started", *(r["started"] for r in runs)),
             md_row("load average before (1, 5, 15 min)", *(" ".join(f"{x:.1f}" for x in r["load_before"])
                                                            for r in runs)),
             md_row("load average after", *(" ".join(f"{x:.1f}" for x in r["load_after"]) for r in runs))]
    timed = [dict(steps(r["output"])) for r in runs]
    for what in names:
        lines.append(md_row(what.replace("|", "\\|"), *(f"{t[what]:.1f} s" if what in t else "-" for t in timed)))
    lines += [md_row("**`make demo-install`, wall clock**", *(f"**{r['wall_s']:.1f} s**" if r["returncode"] == 0
                                                              else f"failed (exit {r['returncode']})" for r in runs)),
              md_row("the venv holds", *(installed(r) for r in runs)), ""]
    empty = [r["wall_s"] for r in runs if r["cache"] == "empty" and r["returncode"] == 0]
    if empty:
        worst = max(empty)
        verdict = (f"under the {TARGET_S:.0f} s target by {TARGET_S - worst:.1f} s" if worst < TARGET_S
                   else f"over the {TARGET_S:.0f} s target by {worst - TARGET_S:.1f} s")
        lines += [f"From an empty cache: {', '.join(f'{x:.1f} s' for x in empty)}; the slowest is {verdict}.", ""]
    return lines


def render(folders: list[Path]) -> str:
    lines = ["# `make demo`'s setup from a fresh clone (measured)", "",
             "What a new user meets before the demo runs: `make demo-install` (the first part of `make demo`) in a "
             "fresh clone, with new empty pip and uv caches (`PIP_CACHE_DIR`, `UV_CACHE_DIR`), then once more in "
             "another fresh clone with the caches the last run filled (warm). Each step's time is its own progress "
             "line; the wall clock is the whole `make`. The machine's 2 cores are shared with other jobs: the load "
             f"average before and after each run is in the tables. Issue #27's target: under {TARGET_S:.0f} s from "
             "an empty cache.", "",
             "Where the packages came from: torch's CPU wheel from the machine's wheel folder (pip's find-links, "
             "local disk) in every run. pip also read the machine's local package mirrors (its extra index URLs, "
             "files on disk) beside PyPI; uv reads no pip configuration and downloaded everything else from PyPI. "
             "Where no wheel folder is configured the Makefile takes torch from PyTorch's CPU index "
             "(its wheel is 192 MB): not reachable from this machine, so not measured here.", ""]
    for folder in folders:
        lines += render_folder(folder)
    lines.append(f"Rendered from the raw runs by `python -m benchmarks.setup_time render "
                 f"{' '.join(shown_path(f) for f in folders)}`.")
    return "\n".join(lines) + "\n"


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number of runs, 1 or more")
    return int(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time `make demo-install` from empty caches, then warm; one JSON per run")
    m.add_argument("out", type=Path, help="folder for the runs' JSON")
    m.add_argument("--commit", default="HEAD", help="the commit to clone and time (default: HEAD)")
    m.add_argument("--runs", type=positive, default=2, help="runs from empty caches before the warm one (default: 2)")
    r = sub.add_parser("render", help="print the Markdown of the runs in these folders")
    r.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.command == "measure":
        measure(args.out, args.commit, args.runs)
    else:
        missing = [str(f) for f in args.folders if not f.is_dir()]
        if missing:
            raise SystemExit(f"setup_time: not a folder of runs: {', '.join(missing)}")
        sys.stdout.write(render(args.folders))


if __name__ == "__main__":
    main()
