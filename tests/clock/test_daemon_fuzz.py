"""Fuzzed requests (hypothesis): every input gets a 2xx/4xx answer, never a 5xx or a dead daemon."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.clockd_study.harness import call
from envpipe.clock.service import ServiceConfig
from tests.support.clockd_helpers import daemon_thread

TRIED = {"n": 0}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(["gpus", "ttl_s", "pod", "lease", "mhz", "x"])
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(keys, json_values, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    sock = str(tmp_path_factory.mktemp("fuzz") / "c.sock")
    with daemon_thread(sock, config=ServiceConfig(min_mhz=900, max_mhz=1410), max_rps=1e6):
        gpus = [g["uuid"] for g in call(sock, "GET", "/v1/gpus")[1]["gpus"]]
        lease = call(sock, "POST", "/v1/leases", {"gpus": gpus[:1], "ttl_s": 300})[1]["lease"]
        yield sock, gpus, lease
        assert call(sock, "GET", "/healthz")[0] == 200
    print(f"\nfuzz: {TRIED['n']} inputs tried, 0 crashes")


def check(sock: str, method: str, path: str, raw: bytes) -> None:
    TRIED["n"] += 1
    status, body = call(sock, method, path, raw=raw)
    assert status < 500, (path, raw, status, body)
    if status >= 400:
        assert isinstance(body, dict) and body.get("message"), body


@FUZZ
@given(raw=bodies, which=st.sampled_from(["lease", "lock", "reset", "renew"]))
def test_fuzz_bodies(fuzz_daemon, raw, which) -> None:
    sock, gpus, lease = fuzz_daemon
    path = {
        "lease": "/v1/leases",
        "lock": f"/v1/gpus/{gpus[0]}/lock",
        "reset": f"/v1/gpus/{gpus[1]}/reset",
        "renew": f"/v1/leases/{lease}/renew",
    }[which]
    check(sock, "POST", path, raw)


@FUZZ
@given(
    segment=st.text(min_size=1, max_size=40).filter(lambda s: "/" not in s and "?" not in s and "#" not in s),
    mhz=st.integers(-10, 200_000) | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=5),
)
def test_fuzz_gpu_ids_and_clocks(fuzz_daemon, segment, mhz) -> None:
    sock, gpus, lease = fuzz_daemon
    from urllib.parse import quote

    check(sock, "POST", f"/v1/gpus/{quote(segment)}/lock", json.dumps({"lease": lease, "mhz": mhz}).encode())
    check(sock, "POST", f"/v1/gpus/{gpus[0]}/lock", json.dumps({"lease": lease, "mhz": mhz}).encode())
    check(sock, "GET", f"/v1/gpus/{quote(segment)}", b"")
