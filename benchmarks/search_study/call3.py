"""The second held-out round (call3): layer profile v3 with per-call costs, two calls' runs, and the host-speed
and layer-chain diagnostics taken after it."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.search_study.common import (
    GIB,
    MEMORY_TARGET,
    MS,
    RAW,
    SHORT_LIMIT,
    TIME_TARGET,
    US,
    held_rows,
    held_table,
    load_json,
    smi_excerpt,
    summary,
)
from benchmarks.search_study.per_unit import LAUNCH_BOUND, decile, unit_regimes_table, units
from envpipe.search.layers import load_layer_profile

CALL3 = RAW / "call3"
CALL3_RUNS = ("run1", "run2")


def calls_table() -> list[str]:
    lines = ["| model | backward() call (us) | gradient zeroing call (us) | per backward unit, the profile's layers "
             "(ms) | micro-batch load by size (us) |", "|---|---|---|---|---|"]
    for run in CALL3_RUNS:
        for model in sorted((CALL3 / run / "heldout").iterdir()):
            profile = load_layer_profile(model / "layers.json")
            c = profile.unit_calls
            loads = ", ".join(f"{b}: {c.load(b) * US:.0f}" for b in profile.micro_batch_sizes)
            lines.append(f"| {model.name} | {c.backward_call_s * US:.0f} | {c.grad_zero_call_s * US:.0f} | "
                         f"{c.backward_s * profile.num_layers * MS:.2f} | {loads} |")
    return lines


def host_speed_rows() -> tuple[list[str], dict[str, Any]]:
    data = load_json(CALL3 / "host_speed.json")
    lines = ["| workload | pinned to one CPU | windows | per-window median sample, deciles 1 / 5 / 9 (us) | "
             "slowest / fastest window | steal (s, all CPUs) |", "|---|---|---|---|---|---|"]
    python = []
    for r in data["runs"]:
        m = r["window_medians_s"]
        lines.append(f"| {r['workload']} | {'yes' if r['pinned'] else 'no'} | {len(m)} | {decile(m, 1) * US:.0f} / "
                     f"{statistics.median(m) * US:.0f} / {decile(m, 9) * US:.0f} | {max(m) / min(m):.1f} | "
                     f"{r['steal_ticks'] / data['clock_ticks_per_s']:.2f} |")
        if r["workload"] == "python":
            python += m
    context = (CALL3 / "host_context.txt").read_text().splitlines()
    slow = [x for x in python if x > 1.5 * min(python)]
    facts = {"load": context[1].split("load average:")[1].split(",")[0].strip(),
             "fast": statistics.median(x for x in python if x <= 1.5 * min(python)), "slow": statistics.median(slow),
             "slow_share": len(slow) / len(python)}
    return lines, facts


def chain_rows() -> tuple[list[str], dict[str, dict[str, float]]]:
    data = load_json(CALL3 / "chain.json")
    lines = ["| model | blocks | pairs | forward: chain / profiled host / profiled repeat (ms) | paired ratio profiled "
             "host / chain | backward: chain / profiled host / profiled repeat (ms) | paired ratio profiled host / "
             "chain |", "|---|---|---|---|---|---|---|"]
    ratios: dict[str, dict[str, float]] = {}
    for name, pairs in data["models"].items():
        med = {k: statistics.median(p[k] for p in pairs) for k in pairs[0]}
        ratio = {u: statistics.median(p[f"profiled_{u}_host_s"] / p[f"chain_{u}_s"] for p in pairs)
                 for u in ("forward", "backward")}
        ratios[name] = {**ratio, "chain_backward_per_block": med["chain_backward_s"] / data["blocks"]}
        lines.append(f"| {name} | {data['blocks']} | {len(pairs)} | " + " | ".join(
            f"{med[f'chain_{u}_s'] * MS:.2f} / {med[f'profiled_{u}_host_s'] * MS:.2f} / "
            f"{med[f'profiled_{u}_repeat_s'] * MS:.2f} | {ratio[u]:.2f}" for u in ("forward", "backward")) + " |")
    return lines, ratios


def render() -> str:
    shapes, engine = load_json(CALL3 / "shapes.json"), load_json(CALL3 / "engine.json")
    machine = (CALL3 / "run1" / "machine.txt").read_text().splitlines()
    second = (CALL3 / "run2" / "machine.txt").read_text().splitlines()
    held = held_rows(CALL3, CALL3_RUNS)
    per_unit = units(CALL3, CALL3_RUNS)
    speed_lines, speed = host_speed_rows()
    chain_lines, ratios = chain_rows()
    time_ok = [r for r in held if abs(r.time_err) <= TIME_TARGET]
    memory_ok = all(abs(r.need_err) <= MEMORY_TARGET and r.need_err >= SHORT_LIMIT for r in held)
    by_run = {(u["model"], u["b"]): u["regime"] for u in per_unit}
    regimes = {name: [r for r in held if by_run[(r.model, r.b)] == name]
               for name in ("device-bound", "mixed", "launch-bound")}
    tails = [u["tail"] / u["steps"] for u in per_unit]
    launch = [u for u in per_unit if u["regime"] == "launch-bound" and u["model"].startswith("llama")]
    same_work = [statistics.median(u["F"]) for u in launch]
    gpt_b1 = next(u for u in per_unit if u["model"].startswith("gpt2") and u["b"] == 1)
    engine_b_per_layer = statistics.median(gpt_b1["B"]) / gpt_b1["layers"]
    declared = [m["name"] for m in shapes["heldout"]["models"]]
    out = [
        "# `envpipe search` on one GPU, second held-out run: predicted against measured",
        "",
        "Rendered by `python benchmarks/search_results.py call3` from the raw files in",
        "[search_accuracy/call3/](search_accuracy/call3/) (the declaration and engine model committed before the",
        "run, every run's JSON, the layer profiles, the search's outputs, logs, `nvidia-smi -q`, the diagnostics).",
        "The first held-out run and its analysis: [search_accuracy.md](search_accuracy.md), kept as it was.",
        f"**Measured {machine[0]} on one {machine[-1].split(',')[0]}** (driver {machine[-1].split(',')[1].strip()}; "
        f"host: {machine[4].split(':')[1].strip()}, {machine[2].split()[-1]} CPUs; code at commit "
        f"{machine[5].split()[-1]}; {machine[6]}), in two calls on the same machine: run1/ "
        "(`OUT=... COMMIT=49b18cb bash benchmarks/search_accuracy_gpu.sh --sets heldout --shapes "
        "benchmarks/results/search_accuracy/call3/shapes.json --engine-model "
        "benchmarks/results/search_accuracy/call3/engine.json --deadline-s 250`), whose deadline came before "
        f"{declared[1]}, and run2/ (the same with `--models {declared[1]} --deadline-s 230`, started "
        f"{second[0].split()[3]}, machine up {second[3].split('up')[1].split(',')[0].strip()}).",
        "**Clocks and power limits were never changed** (the GPU's clock event counters after each call below).",
        "",
        "```text",
        *smi_excerpt(CALL3 / "run1"),
        "run2: " + smi_excerpt(CALL3 / "run2")[-1],
        "```",
        "",
        "## What was declared before the run",
        "",
        shapes["about"],
        "",
        f"Global batch {shapes['global_batch']}; layer profile: {shapes['profile']['reps']} repetitions after "
        f"{shapes['profile']['warmup']} warm-up units; iterations: {shapes['iterations']['warmup']} warm-up, then "
        f"{shapes['iterations']['iterations']} timed, or as many as fill {shapes['iterations']['min_timed_s']:.0f} s "
        f"at the predicted iteration time, at most {shapes['iterations']['max_iterations']} (median).",
        "",
        "| set | model | family | blocks | hidden | heads | seq | vocab | micro-batch sizes |",
        "|---|---|---|---|---|---|---|---|---|",
        *[f"| heldout | {m['name']} | {m['model']['family']} | {m['model']['layers']} | {m['model']['hidden']} | "
          f"{m['model']['heads']} | {m['model']['seq']} | {m['model']['vocab']} | "
          f"{', '.join(map(str, m['micro_batch_sizes']))} |" for m in shapes["heldout"]["models"]],
        "",
        "The engine model the searches used (call3/engine.json, the search's default since the commit that",
        f"declared this run): host scale {engine['host_scale']:.2f}, engine host work per forward unit "
        f"{engine['unit_host_s'] * MS:.1f} ms and per iteration {engine['iteration_s'] * MS:.1f} ms, allocator "
        f"fragmentation {100 * engine['fragmentation']:.1f} %, outside the allocator beyond the profile's "
        f"{engine['outside_allocator_bytes'] / GIB:.3f} GiB, allocator {engine['allocator']}. Its label: "
        f"\"{engine['label']}\".",
        "",
        "## Targets (issue #25), and what the run shows",
        "",
        "On every held-out configuration: iteration time within 5 %, peak memory within 10 %, never under-predicted",
        "by more than 3 % (memory scored as in the first run: the allocator's peak plus what the process holds",
        "outside it).",
        "",
        "- **Held out**: " + summary(held) + ".",
        f"- **Memory: {'met on every run' if memory_ok else 'not met'}** (the memory model is the first run's): "
        f"device need error {100 * min(r.need_err for r in held):+.1f} to "
        f"{100 * max(r.need_err for r in held):+.1f} %.",
        f"- **Time: {'met' if len(time_ok) == len(held) else 'not met'}.** Within 5 % on {len(time_ok)} of "
        f"{len(held)}. By regime (the profile's summed host time over its device time: launch-bound above "
        f"{LAUNCH_BOUND}, device-bound below 1/{LAUNCH_BOUND}): "
        + "; ".join(f"{name} " + ", ".join(f"{r.model} b={r.b} {100 * r.time_err:+.1f} %" for r in found)
                    for name, found in regimes.items() if found) + ".",
        "",
        "## Held-out runs (predictions written by `envpipe search` before each run)",
        "",
        *held_table(held, CALL3, CALL3_RUNS),
        "",
        "## Per unit: the time model against the engine's units",
        "",
        "The search's forward and backward unit (envpipe.search.timing on the run's profile, the declared engine",
        "model) against the units the runtime timed with CUDA events in every timed iteration, and the profile's",
        "optimizer steps against the iteration's tail (wall time after its last unit):",
        "",
        *unit_regimes_table(per_unit),
        "",
        "Where the host sets the pace the backward is predicted long on gpt2_24x1536_s1024 (the chain check below",
        "says why), and the units of one run spread widely (the host, below). The engine's one optimizer step (the",
        f"tail) took {min(tails) * 100:.0f}-{max(tails) * 100:.0f} % of the profile's steps, one synchronized step "
        "per layer.",
        "",
        "## The unit calls the profiles measured",
        "",
        "What each profiled layer's backward carries that the engine's backward pays once (a `backward()` call, a",
        "gradient zeroing: two of each in two calls less in one call), and the micro-batch's load (the job's batch",
        "function, its copy to the device included):",
        "",
        *calls_table(),
        "",
        "They are small: a few percent of a launch-bound backward unit. They are not what the first run's analysis",
        "took them to be, the backward's whole excess over the engine's (see the chain check below).",
        "",
        "## Why the launch-bound runs miss",
        "",
        "**The host's speed is not steady.** After the run, on a fresh machine of the same kind (idle: load average",
        f"{speed['load']}), `python benchmarks/host_speed.py --seconds 15` (host_speed.json) timed a fixed pure-Python",
        "workload and a burst of 64 tiny kernel launches over and over; per 100 ms window the median sample:",
        "",
        *speed_lines,
        "",
        f"The Python workload ran at two speeds, windows of about {speed['fast'] * US:.0f} us and of about "
        f"{speed['slow'] * US:.0f} us ({speed['slow'] / speed['fast']:.1f} times slower; "
        f"{100 * speed['slow_share']:.0f} % of the windows), switching within",
        "seconds, pinned to one CPU or not, with next to no steal time: the machine's CPU changes speed on its own.",
        "The training runs show the same: the launch-bound units of one run spread as wide (the 10th to 90th",
        "percentiles above), and the forward unit of llama_20x1280_s512, launch-bound at "
        + ", ".join(f"b={u['b']}" for u in launch) + " (its profile's host work "
        f"{min(u['forward_host'] for u in launch) * MS:.1f}-{max(u['forward_host'] for u in launch) * MS:.1f} ms at "
        f"each), had medians from {min(same_work) * MS:.1f} to {max(same_work) * MS:.1f} ms in runs a minute apart. "
        "A profile taken at one",
        "time cannot put a launch-bound run taken at another within 5 % on this machine.",
        "",
        "**Profiled one layer at a time, the backward's host time is too long.** `python",
        "benchmarks/layer_chain_check.py --blocks 8 --pairs 20` (chain.json) issued 8 blocks of each held-out model",
        "at micro-batch 1 as one chain, as the engine issues a stage (the forwards, then one `backward()` with",
        "BF16_Optimizer's zeroing before and accumulation after), and right after it the same blocks as the",
        "profiler times them; paired (the median of the pairs' ratios), so that the host's speed changes largely",
        "cancel:",
        "",
        *chain_lines,
        "",
        "The layer-at-a-time backward takes "
        + " and ".join(f"{ratios[m]['backward']:.2f} ({m})" for m in ratios)
        + " times the chain's,",
        "far more than the measured unit calls take out; the chain's backward, "
        f"{ratios[gpt_b1['model']]['chain_backward_per_block'] * MS:.2f} ms per block of {gpt_b1['model']}, is "
        f"the engine's (its backward units at b=1: a median of {engine_b_per_layer * MS:.2f} ms per layer).",
        "What else a lone layer's `backward()` pays was not measured; a guess to check first: waking the autograd",
        "device thread after the host has been issuing forwards, where the two-roots measurement calls it while it",
        "is still awake.",
        "",
        "## Next",
        "",
        "- Profile each layer's backward the way the engine runs it: inside one `backward()` over a chain of copies",
        "  of the layer (rounds of 1 and 4 copies; their difference is the layer's share, with every per-call cost",
        "  cancelled by construction), and check it against the chain above before another held-out run.",
        f"- On a host whose speed changes {speed['slow'] / speed['fast']:.1f}-fold, no time model meets 5 % on "
        "launch-bound runs: the held-out",
        "  scoring needs a steady host (or host-speed readings beside every profile and run, to tell the model's",
        "  error from the host's), and the search could report a launch-bound prediction with the band its",
        "  profile's own host spread implies.",
        "",
    ]
    return "\n".join(out)
