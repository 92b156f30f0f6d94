"""Does the runtime's own metering change what it measures? One GPU, read-only (no clock or power setting).

The drop-in runtime's calibration iterations drew 3-5 % less power than the same 1F1B iterations later in the
steady phase on 2 x H100 (2026-11-27, benchmarks/results/dropin_h100x2.md), and the steady phase's first
iteration after the calibration's idle pause 6.5 % less. Calibration differs from steady iterations in three
ways this probe separates, on a training-like load (a bf16 transformer stack, forward and backward, back to
back like the engine's iterations):

- ``plain``: the energy counter polled every 5 ms (envpipe.energy.meter.PolledMeter), nothing else;
- ``clocks``: the SM clock read with every poll too (what calibration turns on: ``sample_clocks``);
- ``clocks_every_N``: the SM clock read every N-th poll only;
- ``events``: each forward and backward timed with CUDA events (the engine's timed iterations);
- ``after_idle``: one iteration after 0.5 s without work (the calibration's idle-power measurement).

Conditions rotate in blocks of iterations, repeated, so drift (warm-up, temperature) spreads over all of
them; each block's energy is the counter between its first start and last end. Output: one JSON file with
every iteration (time, energy, condition, temperature); energies are measured (NVML counter).

    python benchmarks/meter_probe.py --out probe_gpu0.json --device 0      # on a GPU machine
    python benchmarks/meter_probe.py --render FOLDER                       # the table, from FOLDER/probe_*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import envpipe.energy.meter as meter_module
from benchmarks.common import shown_path
from envpipe.energy.meter import PolledMeter, nvml_reader, nvml_sm_clock

CONDITIONS = ("plain", "clocks", "clocks_every_10", "events", "after_idle")


def build(layers: int, hidden: int) -> nn.Module:
    layer = lambda: nn.TransformerEncoderLayer(hidden, hidden // 128, 4 * hidden, batch_first=True,  # noqa: E731
                                               norm_first=True, dropout=0.0)
    return nn.Sequential(*[layer() for _ in range(layers)]).cuda().to(torch.bfloat16)


def iteration(model: nn.Module, x: torch.Tensor, events: bool) -> None:
    if events:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        marks[0].record()
    loss = model(x).float().pow(2).mean()
    if events:
        marks[1].record()
    loss.backward()
    if events:
        marks[2].record()
    torch.cuda.synchronize()


def render(folders: list[Path]) -> str:
    """Per GPU: each condition's median block power and iteration time against `plain` (measured)."""
    lines = ["# Does the runtime's metering change what it measures?", "",
             "benchmarks/meter_probe.py on each GPU at once: a bf16 transformer stack (forward and backward, back to "
             "back) in blocks of iterations per condition, conditions rotated per round. Power: a block's NVML "
             "counter energy over its time (measured); change against `plain`: the medians over rounds. Clocks and "
             "power limits untouched. `after_idle` is one iteration after 0.5 s without work, shorter than the "
             "counter's update period: its power shows the counter, not the GPU. The load draws about the power "
             "limit in machine.txt (a pipeline stage drew 520-650 W).", ""]
    for folder in folders:
        machine = (folder / "machine.txt").read_text().strip().splitlines()
        lines += [f"Raw data: `{shown_path(folder)}`. "
                  f"{(folder / 'command.txt').read_text().strip()} Machine:", "", *(f"    {x}" for x in machine), ""]
        for path in sorted(folder.glob("probe_gpu*.json")):
            raw = json.loads(path.read_text())
            by: dict[str, list[dict]] = {}
            for b in raw["blocks"]:
                by.setdefault(b["condition"], []).append(b)

            def power(blocks: list[dict]) -> float:
                return statistics.median(b["energy_j"] / b["time_s"] for b in blocks)

            def iteration_s(blocks: list[dict]) -> float:
                return statistics.median(b["time_s"] / len(b["iteration_energy_j"]) for b in blocks)

            plain = by["plain"]
            lines += [f"{path.stem}: {raw['gpu']}, counter update period (median) "
                      f"{1e3 * raw['counter_update_s_median']:.0f} ms, {raw['args']['block']} iterations per block", "",
                      "| condition | rounds | power (W) | vs plain | iteration (ms) | vs plain |",
                      "| --- | --- | --- | --- | --- | --- |"]
            for cond, blocks in by.items():
                watts, seconds = power(blocks), iteration_s(blocks)
                lines.append(f"| {cond} | {len(blocks)} | {watts:.0f} | {watts / power(plain) - 1:+.1%} "
                             f"| {1e3 * seconds:.1f} | {seconds / iteration_s(plain) - 1:+.1%} |")
            lines.append("")
    return "\n".join([*lines, f"Rendered by `python benchmarks/meter_probe.py --render "
                              f"{' '.join(shown_path(f) for f in folders)}`.", ""])


def main() -> None:
    if sys.argv[1:2] == ["--render"]:
        print(render([Path(p) for p in sys.argv[2:]]), end="")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--block", type=int, default=15, help="iterations per block")
    ap.add_argument("--rounds", type=int, default=6, help="times every condition's block runs")
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()

    torch.cuda.set_device(a.device)
    import pynvml

    read_j, close_j = nvml_reader(a.device)
    read_mhz, close_mhz = nvml_sm_clock(a.device)
    handle = pynvml.nvmlDeviceGetHandleByIndex(a.device)
    meter = PolledMeter(read_j, read_clock_mhz=read_mhz)
    model = build(a.layers, a.hidden)
    x = torch.randn(a.batch, a.seq, a.hidden, device="cuda", dtype=torch.bfloat16)
    for _ in range(a.warmup):
        iteration(model, x, False)

    rows, blocks = [], []
    t_first = time.perf_counter()
    for r in range(a.rounds):
        order = CONDITIONS[r % len(CONDITIONS):] + CONDITIONS[:r % len(CONDITIONS)]  # rotate: no fixed neighbour
        for cond in order:
            every = int(cond.rsplit("_", 1)[1]) if cond.startswith("clocks_every_") else 1
            meter_module.CLOCK_EVERY = every  # read by the polling thread at every poll
            meter.sample_clocks = cond.startswith("clocks")
            if cond == "after_idle":
                time.sleep(0.5)
            starts = []
            for i in range(1 if cond == "after_idle" else a.block):
                t0 = time.perf_counter()
                iteration(model, x, cond == "events")
                t1 = time.perf_counter()
                starts.append((t0, t1))
                rows.append({"round": r, "condition": cond, "i": i, "start_s": t0 - t_first, "time_s": t1 - t0})
            meter.sample_clocks = False
            temp = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
            blocks.append({"round": r, "condition": cond, "start": starts[0][0], "end": starts[-1][1],
                           "iterations": [(s, e) for s, e in starts], "temperature_c": temp})
    meter.wait_until(blocks[-1]["end"])
    for b in blocks:
        b["energy_j"] = float(meter.trace.between(b["start"], b["end"]))
        b["iteration_energy_j"] = [float(meter.trace.between(s, e)) for s, e in b.pop("iterations")]
        b["time_s"] = b["end"] - b["start"]
        b["start"], b["end"] = b["start"] - t_first, b["end"] - t_first
    updates = meter.trace.update_intervals()
    meter.close()
    close_mhz()
    close_j()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(a.device),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "counter_update_s_median": float(sorted(updates)[len(updates) // 2]) if len(updates) else None,
        "blocks": blocks, "iterations": rows}, indent=1))


if __name__ == "__main__":
    main()
