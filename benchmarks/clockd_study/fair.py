"""Fair service under abuse: 8 well-behaved envpipe-clockd clients beside one abusive one.

A real daemon process (sim backend, 9 GPUs) serves 8 client processes that each hold a lease through the
bundled ClockClient (heartbeats, attach stream) and lock their GPU 50 times a second, alternating two
clocks, while a prober polls /healthz on the metrics port as the kubelet does. The same load runs twice:
alone, then beside benchmarks/clockd_study/abuser.py (its own lease, an attach flood on it, slow request bodies,
10,000 idle connections, a request flood claiming a new pod each time, bytes that are not HTTP). A
well-behaved client must see 0 errors and keep its lease; its p99 is reported.

    python benchmarks/clockd_results.py fair [--seconds S] [--update | --out OUT.md]   run, write JSON and Markdown
    python benchmarks/clockd_results.py fair-render RAW.json                          print the Markdown of a run

The raw results (every request's latency) go to benchmarks/results/clockd_fair.json beside the Markdown.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, add_output_options, machine_line, output_path, write_results

CLIENTS, RATE_HZ, SECONDS = 8, 50.0, 30.0
ABUSE = ("--attach", "256", "--slow-bodies", "300", "--connections", "10000", "--flood", "4", "--bad-http", "2")
CLOCKS = (1005, 1200)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(sock: str, metrics_port: int) -> subprocess.Popen[str]:
    args = ["--backend", "sim", "--ownership", "local", "--sim-gpus", str(CLIENTS + 1), "--metrics-port",
            str(metrics_port)]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "envpipe.clock.daemon", *args, "--socket", sock, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert daemon.stdout is not None
    if '"ready"' not in daemon.stdout.readline():
        raise SystemExit("envpipe-clockd did not start")
    return daemon


def well_behaved(sock: str, gpu: str, seconds: float, out: mp.Queue) -> None:
    """One trainer: a lease held by ClockClient, a lock every 1/RATE_HZ s, each timed; every failure kept."""
    from envpipe.clock.client import ClockClient

    latencies_us: list[int] = []
    errors: list[str] = []
    client = ClockClient(sock, gpu_uuids=[gpu], ttl_s=5.0)
    start = time.monotonic()
    i = 0
    while (now := time.monotonic()) < start + seconds:
        t0 = time.perf_counter()
        try:
            client.lock_now(gpu, CLOCKS[i % 2])
        except Exception as exc:  # every failure is a result here
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
        latencies_us.append(round((time.perf_counter() - t0) * 1e6))
        i += 1
        time.sleep(max(0.0, start + i / RATE_HZ - time.monotonic()))
    if client.last_error is not None:  # a failed heartbeat counts too
        errors.append(f"last_error {type(client.last_error).__name__}: {client.last_error}"[:200])
    out.put(
        {"gpu": gpu, "latencies_us": latencies_us, "errors": errors, "reattaches": client.reattaches,
         "uncontrolled_s": round(client.uncontrolled_s(), 3), "seconds": round(now - start, 3)}
    )
    client.close()


def probe(port: int, stop: threading.Event, found: dict[str, Any]) -> None:
    """The kubelet's liveness probe: a new connection and GET /healthz every 100 ms, 2 s timeout."""
    while not stop.wait(0.1):
        t0 = time.perf_counter()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
        except Exception as exc:  # a failed probe is a result
            found["errors"].append(f"{type(exc).__name__}: {exc}"[:200])
        found["latencies_us"].append(round((time.perf_counter() - t0) * 1e6))


def metrics_of(port: int) -> dict[str, float]:
    """The daemon's counters that tell what it refused (sample name with labels -> value)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    wanted = ("refused_requests_total", "bad_http_requests_total", "internal_errors_total", "connections_closed_total")
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.removeprefix("envpipe_clockd_") in wanted:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                found[f"{s.name.removeprefix('envpipe_clockd_')}{{{labels}}}"] = s.value
    return found


def phase(name: str, seconds: float, abuse: bool) -> dict[str, Any]:
    sock = os.path.join(os.path.dirname(os.path.abspath(__file__)), f".fair-{os.getpid()}.sock")
    port = free_port()
    daemon = start_daemon(sock, port)
    abuser = None
    try:
        from envpipe.clock.client import list_gpus

        gpus = [g["uuid"] for g in list_gpus(sock)]
        if abuse:
            abuser = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.clockd_study.abuser", sock, "--gpu", gpus[-1], *ABUSE],
                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            assert abuser.stdout is not None
            abuser.stdout.readline()  # it holds its lease and attacks
            time.sleep(2.0)  # the attack at full strength before the trainers start
        load_before = os.getloadavg()
        stop = threading.Event()
        probed: dict[str, list[Any]] = {"latencies_us": [], "errors": []}
        prober = threading.Thread(target=probe, args=(port, stop, probed), daemon=True)
        prober.start()
        q: mp.Queue = mp.Queue()
        procs = [mp.Process(target=well_behaved, args=(sock, g, seconds, q)) for g in gpus[:CLIENTS]]
        for p in procs:
            p.start()
        clients = [q.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join()
        stop.set()
        prober.join()
        daemon_counts = metrics_of(port)
        tally = None
        if abuser is not None:
            abuser.send_signal(signal.SIGTERM)
            out, _ = abuser.communicate(timeout=60)
            tally = json.loads(out.strip().splitlines()[-1])
        return {
            "phase": name, "abuse": list(ABUSE) if abuse else None, "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "clients": clients, "probe": probed,
            "daemon": daemon_counts, "abuser": tally,
        }
    finally:
        if abuser is not None and abuser.poll() is None:
            abuser.kill()
            abuser.communicate()
        daemon.terminate()
        daemon.communicate(timeout=30)


# ---- the Markdown, from the raw JSON alone -----------------------------------------------------------
RENDER_COMMAND = "python benchmarks/clockd_results.py fair-render benchmarks/results/clockd_fair.json"
RAW_KEYS = ("date", "machine", "clients", "rate_hz", "seconds", "abuse", "phases")


def pct(xs: list[int], q: float) -> float:
    """The q-quantile in ms (nearest rank)."""
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] / 1000


def render(raw: dict[str, Any]) -> str:
    lines = [
        f"# envpipe-clockd: fair service under abuse (measured, {raw['date']})",
        "",
        f"Machine: {raw['machine']}. Load average (1, 5, 15 min) before each phase is in the table; the CPUs "
        "are shared with other jobs, so compare phases of one run, not runs.",
        f"Daemon: a real `envpipe-clockd --backend sim` process with {raw['clients'] + 1} simulated GPUs and "
        "default limits; HTTP, sockets and processes are real, the GPUs simulated.",
        f"Well-behaved: {raw['clients']} client processes, each a `ClockClient` with its own lease (TTL 5 s, "
        f"heartbeats, attach stream) locking its GPU {raw['rate_hz']:g} times a second (1005 ↔ 1200 MHz) for "
        f"{raw['seconds']:g} s; a prober polls `/healthz` on the metrics port every 100 ms with a new "
        "connection (2 s timeout), as the kubelet does.",
        f"Abusive (second phase): one process, `benchmarks/clockd_study/abuser.py {' '.join(raw['abuse'])}`: its own "
        "lease with 256 attach streams asked on it, 300 request bodies that never finish, 10,000 idle "
        "connections, 4 connections sending requests back to back (a new claimed pod each), 2 sending bytes "
        "that are not HTTP; each reconnects as soon as the daemon closes it.",
        "",
        "| phase | load before | lock requests | errors | leases lost | lock p50 / p99 / max (ms) "
        "| probes: errors, p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in raw["phases"]:
        lat = [x for c in p["clients"] for x in c["latencies_us"]]
        errors = sum(len(c["errors"]) for c in p["clients"])
        lost = sum(c["reattaches"] > 0 or c["uncontrolled_s"] > 0 for c in p["clients"])
        probe_lat, probe_errors = p["probe"]["latencies_us"], len(p["probe"]["errors"])
        lines.append(
            f"| {p['phase']} | {' '.join(f'{x:.1f}' for x in p['load_before'])} | {len(lat):,} | {errors} | {lost} "
            f"| {pct(lat, 0.5):.1f} / {pct(lat, 0.99):.1f} / {max(lat) / 1000:.0f} "
            f"| {probe_errors} of {len(probe_lat)}, {pct(probe_lat, 0.5):.1f} / {pct(probe_lat, 0.99):.1f} |"
        )
    abused = next(p for p in raw["phases"] if p["abuser"] is not None)
    per_client = [pct(c["latencies_us"], 0.99) for c in abused["clients"]]
    lines += [
        "",
        f"Per well-behaved client under abuse, lock p99 (ms): {', '.join(f'{x:.1f}' for x in per_client)} "
        f"(median {statistics.median(per_client):.1f}).",
        "",
        "What the daemon answered the abuser (its own count, by attack and status; 0: the connection closed "
        "before an answer). Its attacks share one caller's connection cap (32): each new connection of "
        "the 10,000 closes one of its older ones, so its other attacks mostly lose their connections "
        "before an answer. tests/clock/test_daemon_abuse.py runs each attack alone (409 for extra attach "
        "streams, 429 for the flood, 408 for slow bodies).",
        "",
        "| attack | answers |",
        "|---|---|",
    ]
    for attack, counts in sorted(abused["abuser"].items()):
        lines.append(f"| {attack} | {', '.join(f'{k}: {v:,}' for k, v in sorted(counts.items()))} |")
    counted = {k: v for k, v in abused["daemon"].items() if v}
    lines += [
        "",
        "The daemon's own counters at the end of the abused phase (`envpipe_clockd_...`): "
        + (", ".join(f"`{k}` {v:,.0f}" for k, v in sorted(counted.items())) or "none moved") + ".",
        "",
        f"Rendered from the raw results by `{RENDER_COMMAND}`.",
    ]
    return "\n".join(lines)


def load(path: Path) -> dict[str, Any]:
    """A run's raw JSON as `main` writes it; ValueError, in one line, for a file that is not one."""
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    missing = [k for k in RAW_KEYS if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise ValueError(f"{path}: not a fair-service run's raw results (no {', '.join(missing)})")
    return dict(raw)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=SECONDS, help=f"each phase's length (default {SECONDS:g})")
    add_output_options(parser, "clockd_fair.md")


def main(args: argparse.Namespace) -> None:
    raw = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "machine": machine_line(), "clients": CLIENTS,
        "rate_hz": RATE_HZ, "seconds": args.seconds, "abuse": list(ABUSE),
        "phases": [phase("alone", args.seconds, abuse=False), phase("beside the abuser", args.seconds, abuse=True)],
    }
    md = output_path(args)
    md.parent.mkdir(parents=True, exist_ok=True)
    raw_path = md.with_suffix(".json")
    raw_path.write_text(json.dumps(raw) + "\n")
    print(f"raw results written to {raw_path}")
    write_results(args, render(raw))
