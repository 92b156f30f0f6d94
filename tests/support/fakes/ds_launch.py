"""A stand-in for DeepSpeed's per-node launcher, `python -u -m deepspeed.launcher.launch ...` (which imports
torch: seconds per start), for tests that follow DeepSpeed's pdsh command line to the ranks in the fast tier.

It reads the arguments launch.py reads (its parser, the options DeepSpeed's runner passes), takes this
node's slots from --world_info (base64 JSON, host -> slots, node --node_rank) and starts one process per
slot as launch.py does: `[python, -u,] SCRIPT [--local_rank=N] ARGS` as argv (no shell), with RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; it exits with the first non-zero status.
Run as `STANDIN -u -m deepspeed.launcher.launch ARGS` (what the runner's command line holds after the
interpreter's path): `install(folder)` writes that executable.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--node_rank", type=int, default=0)
    ap.add_argument("--master_addr", default="127.0.0.1")
    ap.add_argument("--master_port", type=int, default=29500)
    ap.add_argument("--world_info", default="None")
    ap.add_argument("--module", action="store_true")
    ap.add_argument("--no_python", action="store_true")
    ap.add_argument("--no_local_rank", action="store_true")
    ap.add_argument("--save_pid", type=int, default=0)
    ap.add_argument("--enable_each_rank_log", default="None")
    ap.add_argument("--bind_cores_to_rank", action="store_true")
    ap.add_argument("--bind_core_list", default=None)
    ap.add_argument("--log_level", default="info")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("training_script")
    ap.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv[:3] != ["-u", "-m", "deepspeed.launcher.launch"]:
        print(f"ds_launch stand-in: not a launch.py command line: {argv[:3]}", file=sys.stderr)
        return 2
    args = parse(argv[3:])
    world = json.loads(base64.urlsafe_b64decode(args.world_info))
    nodes = list(world)
    first = sum(len(world[n]) for n in nodes[: args.node_rank])
    procs = []
    for local, _ in enumerate(world[nodes[args.node_rank]]):
        cmd = [] if args.no_python else [sys.executable, "-u", *(["-m"] if args.module else [])]
        cmd += [args.training_script, *([] if args.no_local_rank else [f"--local_rank={local}"])]
        env = dict(os.environ, RANK=str(first + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(sum(map(len, world.values()))), MASTER_ADDR=args.master_addr,
                   MASTER_PORT=str(args.master_port))
        procs.append(subprocess.Popen(cmd + args.training_script_args, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


def install(folder: Path) -> Path:
    """`folder/python`: this stand-in, to be put where the runner's command line names its interpreter."""
    from tests.support.commands import python_command  # here: run as a script, this file imports no tests

    return python_command(folder / "python", __file__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
