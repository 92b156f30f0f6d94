"""A fake `pdsh` that does what pdsh over ssh does to a command, on this machine: no ssh, no sshd.

pdsh joins its command words with spaces into one command line, replaces `%h` (the host), `%u` (the user),
`%n` (the host's rank in the -w list) and `%%` (src/common/pipecmd.c; any other `%x` stays), and ssh has the
remote user's shell run it (`$SHELL -c`); here that shell is `bash -c`, one per host, all at once (the
fan-out), in the user's home directory with a login's environment (HOME, USER, LOGNAME, SHELL, PATH): none
of the launcher's variables, which reach a host only through the command line, as over ssh. `-S` exits with
the largest exit status of the hosts. Options it takes: `-S`, `-f N`, `-w host,host`, `-R ssh` (DeepSpeed's
PDSHRunner passes the first three). `install(folder)` puts it on a PATH as `pdsh`.
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType


def pdsh_format(command: str, host: str, user: str, rank: int) -> str:
    out, i = [], 0
    while i < len(command):
        c = command[i]
        if c == "%" and i + 1 < len(command):
            nxt = command[i + 1]
            out.append({"h": host, "u": user, "n": str(rank), "%": "%"}.get(nxt, "%" + nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main(argv: list[str]) -> int:
    hosts: list[str] = []
    largest = False
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        opt = argv[i]
        if opt == "-S":
            largest = True
        elif opt in ("-f", "-w", "-R"):
            i += 1
            if opt == "-w":
                hosts = argv[i].split(",")
        else:
            print(f"pdsh@fake: unknown option {opt}", file=sys.stderr)
            return 2
        i += 1
    command = " ".join(argv[i:])
    user = getpass.getuser()
    home = os.path.expanduser("~")
    login = {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
             "PATH": os.environ.get("PATH", os.defpath)}
    procs = [subprocess.Popen(["bash", "-c", pdsh_format(command, h, user, n)], cwd=home, env=login)
             for n, h in enumerate(hosts)]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # pdsh's ssh module sends SIGTERM whatever it got

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    codes = [p.wait() for p in procs]
    return max(codes, default=0) if largest else 0


def install(folder: Path) -> Path:
    """`folder/pdsh` running this fake with this Python; returns the folder (for PATH)."""
    from tests.support.commands import python_command  # here: run as a script, this file imports no tests

    python_command(folder / "pdsh", __file__)
    return folder


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
