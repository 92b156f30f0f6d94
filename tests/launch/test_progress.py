"""Progress on stderr: a tqdm bar on a real terminal (a pty), one line per change in a log."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

from envpipe_launch.progress import Progress

ROOT = Path(__file__).resolve().parents[2]


def test_a_log_gets_one_line_per_change(capsys) -> None:
    bar = Progress("workers ready", 3)
    for n in (0, 0, 1, 3, 3):
        bar.update(n)
    bar.done()
    assert capsys.readouterr().err == "workers ready 0/3\nworkers ready 1/3\nworkers ready 3/3\n"


def test_a_terminal_gets_a_bar() -> None:
    code = "from envpipe_launch.progress import Progress\nb = Progress('workers ready', 3)\nb.update(3)\nb.done()\n"
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a fresh pty is 0 wide
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'launcher'}", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=secondary, env=env)
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    assert proc.wait(timeout=30) == 0
    text = out.decode()
    assert "workers ready: 100%" in text and "3/3" in text and "\r" in text  # tqdm's bar, redrawn in place
