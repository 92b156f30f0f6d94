"""The daemon's metrics join the cluster's GPU dashboards: base units (hertz, joules), dcgm-exporter's label
names (`gpu` index, `UUID`, `modelName`, and the `pod`, `namespace`, `container` of a leased GPU), and an
energy counter per lease that says what each pod's GPUs used while it held them."""

from __future__ import annotations

import time

from benchmarks.clockd_study.harness import call
from envpipe.clock.metrics import LeaseEnergy
from tests.support.clockd_helpers import daemon_thread, metric, one_metric

POD = {"namespace": "team", "name": "trainer-0"}


def test_gpu_series_carry_dcgm_exporter_labels_and_the_pod_that_holds_the_gpu(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock):
        gpus = call(sock, "GET", "/v1/gpus")[1]["gpus"]
        lease = call(sock, "POST", "/v1/leases", {"gpus": [gpus[1]["uuid"]], "pod": POD})[1]["lease"]
        call(sock, "POST", f"/v1/gpus/{gpus[1]['uuid']}/lock", {"lease": lease, "mhz": 1200})
        text = call(sock, "GET", "/metrics")[1]
        series = {s["UUID"]: s for s, _ in metric(text, "envpipe_clockd_sm_clock_hertz")}
        assert series[gpus[1]["uuid"]] == {
            "gpu": "1", "UUID": gpus[1]["uuid"], "modelName": gpus[1]["name"],
            "pod": "trainer-0", "namespace": "team", "container": "",
        }
        assert series[gpus[0]["uuid"]]["pod"] == "" and series[gpus[0]["uuid"]]["gpu"] == "0"
        assert one_metric(text, "envpipe_clockd_sm_clock_hertz", UUID=gpus[1]["uuid"]) == 1200e6
        for name in ("envpipe_clockd_energy_joules_total", "envpipe_clockd_gpu_healthy",
                     "envpipe_clockd_driver_timeouts_total"):
            assert {s["UUID"] for s, _ in metric(text, name, pod="trainer-0")} == {gpus[1]["uuid"]}, name
        call(sock, "DELETE", f"/v1/leases/{lease}")
        text = call(sock, "GET", "/metrics")[1]
        assert metric(text, "envpipe_clockd_sm_clock_hertz", pod="trainer-0") == []  # the lease took its pod along


def test_each_lease_counts_the_energy_its_gpus_used_while_it_held_them(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock):
        gpu = call(sock, "GET", "/v1/gpus")[1]["gpus"][0]["uuid"]
        before = call(sock, "GET", f"/v1/gpus/{gpu}")[1]["energy_mj"]
        lease = call(sock, "POST", "/v1/leases", {"gpus": [gpu], "pod": POD})[1]["lease"]
        call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1200})
        time.sleep(0.2)
        labels = {"pod": "trainer-0", "namespace": "team", "lease": lease[:8], "UUID": gpu, "gpu": "0"}

        def joules() -> float:
            return one_metric(call(sock, "GET", "/metrics")[1], "envpipe_clockd_lease_energy_joules_total", **labels)

        first = joules()
        time.sleep(0.2)
        second = joules()
        assert 0 < first < second  # a counter: it grows while the lease holds the GPU
        call(sock, "DELETE", f"/v1/leases/{lease}")
        after = call(sock, "GET", f"/v1/gpus/{gpu}")[1]["energy_mj"]
        final = joules()
        assert second <= final <= (after - before) / 1000  # read at the lease's end, kept for the next scrape
        time.sleep(0.1)
        assert joules() == final


def test_an_ended_lease_counter_is_kept_a_while_and_a_counter_reset_adds_nothing() -> None:
    from envpipe.clock.backends import GpuStatic
    from envpipe.clock.leases import Lease

    now = [0.0]
    book = LeaseEnergy(keep_s=60, max_ended=2, clock=lambda: now[0])
    gpu = GpuStatic("GPU-1", "H200", (1980,), 0)
    book.start(Lease("lease-a", ("GPU-1",), 5.0, 5.0, "pid=1"), gpu, 1_000)
    book.update("lease-a", "GPU-1", 3_000)
    book.update("lease-a", "GPU-1", 500)  # the driver reloaded: its counter starts again
    book.update("lease-a", "GPU-1", 1_500)
    assert book.joules("lease-a", "GPU-1") == 3.0
    book.end("lease-a", "GPU-1")
    now[0] = 59
    assert [s.value for s in next(iter(book.collect())).samples] == [3.0]
    now[0] = 61
    assert list(next(iter(book.collect())).samples) == []
    for i in range(4):  # at most max_ended ended leases are kept
        book.start(Lease(f"l{i}", ("GPU-1",), 5.0, 5.0, "pid=1"), gpu, 0)
        book.end(f"l{i}", "GPU-1")
    assert len(next(iter(book.collect())).samples) == 2
