"""An abusive envpipe-clockd client, for the fair-service benchmark and the abuse tests.

It holds a lease of its own and attacks from one process: a flood of attach streams on that lease, slow
request bodies, idle connections, requests as fast as it can send them (claiming a new pod name on each),
and bytes that are not HTTP (a newline in the path, garbage request lines). Each attack reconnects as soon
as the daemon closes its connection, so the pressure lasts. It stops on SIGTERM or after --seconds and
prints one JSON line: what the daemon answered, per attack.

    python -m benchmarks.clockd_study.abuser SOCKET --gpu UUID [--attach N] [--slow-bodies N] [--connections N]
        [--flood N] [--bad-http N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import signal

Tally = collections.Counter[str]
GARBAGE = (
    b"GET /v1/gpus%0a2026-11-24 envpipe.clockd.audit INFO {\"event\": \"lease_open\"} HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS hello
    b"GET / HTTP/9.9\r\n" + b"X: " + b"y" * 9000 + b"\r\n\r\n",  # a header past aiohttp's line limit
    b"POST /v1/leases HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
)


async def read_answer(reader: asyncio.StreamReader) -> int:
    """The status of one HTTP answer, its body read (0: the connection closed first)."""
    line = await reader.readline()
    if not line:
        return 0
    status = int(line.split()[1])
    length = 0
    while (header := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def request(sock: str, raw: bytes) -> int:
    reader, writer = await asyncio.open_unix_connection(sock)
    try:
        writer.write(raw)
        return await read_answer(reader)
    finally:
        writer.close()


def post(path: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: clockd\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"\r\n" + data


async def lease_of_my_own(sock: str, gpu: str) -> str:
    reader, writer = await asyncio.open_unix_connection(sock)
    writer.write(post("/v1/leases", {"gpus": [gpu], "ttl_s": 300}))
    line = await reader.readline()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    body = json.loads(await reader.readexactly(length))
    writer.close()
    if b" 201 " not in line:
        raise SystemExit(f"the abuser could not open its lease: {body}")
    return str(body["lease"])


LOST = (OSError, ValueError, IndexError, asyncio.IncompleteReadError)  # refused, reset, or cut mid-answer


async def again() -> None:
    """Pause before reconnecting: a connection the daemon closed comes back at once, but not in a spin."""
    await asyncio.sleep(0.05)


async def attach_flood(sock: str, lease: str, tally: Tally) -> None:
    raw = f"GET /v1/leases/{lease}/attach HTTP/1.1\r\nHost: clockd\r\n\r\n".encode()
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(raw)
            tally[f"attach {await read_answer(reader)}"] += 1
            while await reader.read(4096):  # a stream, if the daemon granted one
                pass
            writer.close()
        except LOST:
            tally["attach: connection lost"] += 1
        await again()


async def renew_forever(sock: str, lease: str, tally: Tally) -> None:
    while True:
        with contextlib.suppress(*LOST):
            tally[f"renew {await request(sock, post(f'/v1/leases/{lease}/renew', {}))}"] += 1
        await asyncio.sleep(1.0)


async def slow_body(sock: str, tally: Tally) -> None:
    head = b"POST /v1/leases HTTP/1.1\r\nHost: clockd\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(head)
            answer = asyncio.ensure_future(read_answer(reader))
            answer.add_done_callback(lambda t: t.cancelled() or t.exception())  # read even if we stop first
            try:
                while not answer.done():
                    writer.write(b" ")  # one byte a second: never the whole body
                    await asyncio.wait([answer], timeout=1.0)
                tally[f"slow body {answer.result()}"] += 1
            finally:
                answer.cancel()
                writer.close()
        except LOST:
            tally["slow body: connection lost"] += 1
        await again()


async def idle_connection(sock: str, tally: Tally) -> None:
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(sock)
            tally["idle: connected"] += 1
            await reader.read(1)  # until the daemon closes it
            writer.close()
        except LOST:
            tally["idle: connection lost"] += 1
        await asyncio.sleep(0.2)


async def flood(sock: str, tally: Tally) -> None:
    n = 0
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(sock)
            while True:
                n += 1  # a new claimed pod each time: claims must not buy a new budget
                writer.write(f"GET /v1/gpus HTTP/1.1\r\nHost: clockd\r\nX-Envpipe-Pod: ns/pod-{n}\r\n\r\n".encode())
                status = await read_answer(reader)
                tally[f"flood {status}"] += 1
                if status == 0:
                    break
        except LOST:
            tally["flood: connection lost"] += 1
        await again()


async def bad_http(sock: str, tally: Tally) -> None:
    while True:
        for raw in GARBAGE:
            try:
                tally[f"bad http {await request(sock, raw)}"] += 1
            except LOST:
                tally["bad http: connection lost"] += 1
        await asyncio.sleep(0.001)


async def abuse(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    tallies: dict[str, Tally] = {k: collections.Counter() for k in ("attach", "slow", "idle", "flood", "bad")}
    lease = await lease_of_my_own(args.socket, args.gpu)
    work = [renew_forever(args.socket, lease, tallies["attach"])]
    work += [attach_flood(args.socket, lease, tallies["attach"]) for _ in range(args.attach)]
    work += [slow_body(args.socket, tallies["slow"]) for _ in range(args.slow_bodies)]
    work += [idle_connection(args.socket, tallies["idle"]) for _ in range(args.connections)]
    work += [flood(args.socket, tallies["flood"]) for _ in range(args.flood)]
    work += [bad_http(args.socket, tallies["bad"]) for _ in range(args.bad_http)]
    tasks = [asyncio.create_task(w) for w in work]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"abusing": len(tasks)}), flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {k: dict(v) for k, v in tallies.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("socket")
    ap.add_argument("--gpu", required=True, help="the GPU of the abuser's own lease")
    ap.add_argument("--attach", type=int, default=0, help="attach streams asked for at once on its lease")
    ap.add_argument("--slow-bodies", type=int, default=0, help="requests whose body never arrives, at once")
    ap.add_argument("--connections", type=int, default=0, help="idle connections held at once")
    ap.add_argument("--flood", type=int, default=0, help="connections sending requests back to back")
    ap.add_argument("--bad-http", type=int, default=0, help="connections sending what is not HTTP")
    ap.add_argument("--seconds", type=float, default=3600.0)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 10k connections need 10k descriptors
    print(json.dumps(asyncio.run(abuse(args))), flush=True)


if __name__ == "__main__":
    main()
