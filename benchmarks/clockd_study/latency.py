"""Lock-request round trips to envpipe-clockd over its Unix socket (sim backend, a real daemon process).

Measures p50/p99 latency of one client's sequential lock requests, then the sustained rate of 8
concurrent client processes, each with its own lease and GPU, counting errors.
Usage: python benchmarks/clockd_results.py latency [OUT.md | --update]   (default: a new dated file beside
benchmarks/results/clockd_latency.md; --update overwrites that one)
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import tempfile
import time
from datetime import UTC, datetime

from benchmarks.common import add_output_options, start_clockd, write_results

CLIENTS, SECONDS, SEQ_N = 8, 5.0, 2000
DAEMON_ARGS = ("--backend", "sim", "--sim-gpus", str(CLIENTS), "--max-rps", "100000")


class Conn(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("clockd", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)


def request(conn: Conn, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    if body is None:
        conn.request(method, path)
    else:  # the daemon takes JSON bodies only when they say so (a cross-site form cannot)
        conn.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def worker(sock: str, gpu: str, seconds: float, out: mp.Queue) -> None:
    """One keep-alive connection, one lease, lock requests alternating between two clocks."""
    conn = Conn(sock)
    _, lease = request(conn, "POST", "/v1/leases", {"gpus": [gpu], "ttl_s": 60})
    ok = errors = 0
    lat: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t0 = time.perf_counter()
        status, _ = request(
            conn, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease["lease"], "mhz": 1000 + 100 * (i % 2)}
        )
        lat.append(time.perf_counter() - t0)
        ok, errors, i = ok + (status == 200), errors + (status != 200), i + 1
    request(conn, "DELETE", f"/v1/leases/{lease['lease']}")
    out.put((ok, errors, lat))


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000


def sequential(sock: str) -> list[float]:
    """Round-trip times of one client's lock requests, each changing the clock (warm-up dropped)."""
    conn = Conn(sock)
    gpus = [g["uuid"] for g in request(conn, "GET", "/v1/gpus")[1]["gpus"]]
    _, lease = request(conn, "POST", "/v1/leases", {"gpus": [gpus[0]], "ttl_s": 60})
    seq = []
    for i in range(SEQ_N + 200):
        t0 = time.perf_counter()
        status, _ = request(
            conn, "POST", f"/v1/gpus/{gpus[0]}/lock", {"lease": lease["lease"], "mhz": 1000 + 100 * (i % 2)}
        )
        if i >= 200:
            seq.append(time.perf_counter() - t0)
        assert status == 200
    request(conn, "DELETE", f"/v1/leases/{lease['lease']}")
    return seq


def concurrent(sock: str) -> tuple[int, int, list[float], float]:
    """CLIENTS client processes, each with its own lease and GPU, for SECONDS: ok, errors, latencies."""
    gpus = [g["uuid"] for g in request(Conn(sock), "GET", "/v1/gpus")[1]["gpus"]]
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=worker, args=(sock, g, SECONDS, q)) for g in gpus[:CLIENTS]]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    return sum(r[0] for r in results), sum(r[1] for r in results), [x for r in results for x in r[2]], wall


def add_options(parser: argparse.ArgumentParser) -> None:
    add_output_options(parser, "clockd_latency.md", positional=True)


def main(args: argparse.Namespace) -> None:
    load = os.getloadavg()
    logs = tempfile.mkdtemp()
    quiet, quiet_sock = start_clockd(*DAEMON_ARGS, "--log-level", "warning", stderr=subprocess.DEVNULL)
    seq_quiet = sequential(quiet_sock)
    quiet.terminate()
    quiet.wait(10)
    audit_log = os.path.join(logs, "info.log")
    with open(audit_log, "w") as log_file:  # the default level: one audit line per clock change
        daemon, sock = start_clockd(*DAEMON_ARGS, "--log-level", "info", stderr=log_file)
    seq = sequential(sock)
    ok, errors, conc, wall = concurrent(sock)
    daemon.terminate()
    daemon.wait(10)
    with open(audit_log) as f:
        audit_lines = sum('"event": "clock_lock"' in line for line in f)
    rate = ok / SECONDS
    lines = [
        f"# envpipe-clockd lock-request latency (measured, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: `{' '.join(platform.uname())}`, nproc={os.cpu_count()}, "
        f"Python {platform.python_version()}, load average before the run "
        f"{' '.join(f'{x:.1f}' for x in load)} (CPUs shared with other jobs).",
        "Daemon: a real `envpipe-clockd --backend sim` process; clients: HTTP/1.1 keep-alive over the Unix "
        "socket; every request is a lock that changes the clock (1000 ↔ 1100 MHz), so each one goes "
        "through lease check, allow-list, snapping, the (simulated, in-loop) backend, metrics and the "
        "audit log. Rows marked *audit on* run at the default `--log-level info`: every change writes an "
        f"audit line (to a file; {audit_lines:,} lines this run). Backend calls are simulated; HTTP, "
        "sockets and processes are real.",
        "",
        "| measurement | value | target |",
        "|---|---|---|",
        f"| 1 client, sequential, {SEQ_N} requests, audit on: p50 | {pct(seq, 0.5):.3f} ms | |",
        f"| 1 client, sequential, audit on: p99 | {pct(seq, 0.99):.3f} ms | < 2 ms |",
        f"| 1 client, sequential, audit off (`--log-level warning`): p50 / p99 "
        f"| {pct(seq_quiet, 0.5):.3f} / {pct(seq_quiet, 0.99):.3f} ms | |",
        f"| {CLIENTS} concurrent client processes, {SECONDS:.0f} s, audit on: sustained rate "
        f"| {rate:,.0f} requests/s | ≥ 1,000 requests/s |",
        f"| {CLIENTS} concurrent: errors | {errors} of {ok + errors} | 0 |",
        f"| {CLIENTS} concurrent: p50 / p99 per request | {pct(conc, 0.5):.3f} / {pct(conc, 0.99):.3f} ms | |",
        "",
        f"(wall time of the concurrent phase including process start: {wall:.1f} s)",
        "Note: the machine's CPUs are shared with other jobs; a busy machine (load average above the "
        "2 cores) shows a p99 several times higher, so compare runs by their load average.",
    ]
    print("\n".join(lines))
    write_results(args, "\n".join(lines))
