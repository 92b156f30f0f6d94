"""The run's summary as a few lines of text (what `make demo` prints); every number says its kind."""

from __future__ import annotations

from pathlib import Path

from envpipe.runtime.summary import Iterations, PlanInfo, RunSummary, Spread, Verdict


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1e3 * x:.1f} ms"


def _pct(x: float, sign: bool = True) -> str:
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def _spread_pct(s: Spread) -> str:
    return f"{_pct(s.median)} (IQR {_pct(s.q1)} to {_pct(s.q3)}, {s.n} pairs)"


def _iterations(name: str, it: Iterations, energy: str) -> str:
    t = it.time_s
    line = f"    {name}: iteration {_ms(t.median)} (median of {t.n}, IQR {_ms(t.q1)} to {_ms(t.q3)})"
    if it.energy_j is not None:
        line += f", energy {it.energy_j.median:.2f} J per iteration ({energy})"
    return line


def m_label(s: RunSummary) -> str:
    """What this run's own comparison is made of: measured, or on CPU the simulated GPU's numbers."""
    sim = s.clock.energy.startswith("simulated")
    return "the simulated GPU's, both sides" if sim else "measured against measured"


def _got(s: RunSummary) -> str:
    """What this run's own times and energies are: measured, or on CPU a simulated GPU's."""
    return "simulated GPU" if s.clock.time.startswith("simulated") else "measured"


def key_numbers(s: RunSummary) -> list[tuple[str, str]]:
    """The run's headline numbers as (label, value) rows, each label saying measured or simulated (the
    CML notebook's table)."""
    plan, t = s.plan, s.steady.time_s
    rows = [("pipeline", f"{s.stages} stages x {s.microbatches} micro-batches, {s.data_parallel} replica(s)")]
    if plan is not None:
        rows += [("policy / order", f"{plan.policy} / {plan.order}"), ("plan from", plan.source),
                 ("plan deployed", "yes" if plan.deployed else "no: clocks cannot be changed here")]
    rows += [("steady iterations", str(t.n)),
             (f"iteration time ({s.clock.time}, median)", f"{t.median:.3f} s"),
             (f"throughput ({s.clock.time})", f"{s.steady.throughput_samples_per_s:.2f} samples/s")]
    if s.steady.energy_j is not None:
        rows.append((f"energy per iteration ({s.clock.energy})", f"{s.steady.energy_j.median:.1f} J"))
    if s.measured is not None:
        if s.measured.energy_saving is not None:
            rows.append((f"energy saving vs this run's 1F1B all-max iterations ({m_label(s)})",
                         _pct(s.measured.energy_saving.median, sign=False)))
        rows.append((f"slowdown vs this run's 1F1B all-max iterations ({m_label(s)})",
                     _pct(s.measured.slowdown.median)))
    if s.predicted is not None:
        rows += [("energy saving, the planner's prediction (simulated against simulated)",
                  _pct(s.predicted.energy_saving, sign=False)),
                 ("slowdown, the planner's prediction (simulated)", _pct(s.predicted.slowdown))]
    if s.predicted_iteration_time_s is not None:
        rows.append(("iteration time predicted (simulated, anchored on measured 1F1B)",
                     f"{s.predicted_iteration_time_s:.3f} s"))
    if s.time_error is not None:
        rows.append((f"iteration time error (predicted vs {_got(s)})", _pct(s.time_error)))
    return rows


def headline(s: RunSummary) -> str:
    """The run's result in one line: what it saved, measured against what, and how sure."""
    kind = "simulated GPU" if s.clock.energy.startswith("simulated") else "measured"
    sure = "" if s.trust is None else (" (predictions held)" if s.trust.trusted else
                                      " (predictions flagged: see below)")
    v, m = s.verdict, s.measured
    if s.plan is None:
        return f"{s.engine}: {s.steady.throughput_samples_per_s:.2f} samples/s ({s.clock.time}){sure}"
    if v is not None and not v.kept:
        return f"saved nothing: {v.reason} (no harm; {kind}){sure}"
    if m is not None and m.energy_saving is not None:
        return (f"saved {_pct(m.energy_saving.median, sign=False)} energy at {_pct(m.slowdown.median)} time against "
                f"this run's own 1F1B all-max iterations ({kind}, {m.pairs} pairs){sure}")
    if m is not None:
        return f"{_pct(m.slowdown.median)} time against this run's own 1F1B all-max iterations ({kind}; no energy " \
               f"counter){sure}"
    predicted = "" if s.predicted is None else \
        f"; the plan would save {_pct(s.predicted.energy_saving, sign=False)} (predicted, simulated)"
    return f"saved nothing measurable: clocks cannot be set here and the plan's order is 1F1B{predicted}{sure}"


def _deployment(plan: PlanInfo, verdict: Verdict | None) -> str:
    """What of the plan ran: its order and clocks, its order only, or nothing (its order is 1F1B's, or it was
    withdrawn after its comparison pairs)."""
    if verdict is not None and not verdict.kept:
        return " (withdrawn after its comparison pairs: see 'no harm' below; 1F1B runs)"
    if plan.deployed:
        return ""
    if plan.order_deployed:
        return " (its order ran at default clocks; clocks not deployed: they cannot be changed here)"
    return " (reported; clocks not deployed: they cannot be changed here, and its order is 1F1B, the baseline's)"


def render_report(s: RunSummary, report_dir: str | Path) -> str:
    out = Path(report_dir)
    plan = s.plan
    lines = [headline(s),
             f"EnvPipe run: {s.stages} stage{'' if s.stages == 1 else 's'} x {s.microbatches} micro-batches"
             + (f", {s.data_parallel} data-parallel replicas" if s.data_parallel > 1 else "") + f" ({s.engine})"]
    if plan is not None:
        lines.append(f"  plan: policy {plan.policy}, order {plan.order}; from {plan.source}; digest {plan.digest}"
                     + _deployment(plan, s.verdict))
    lines.append(f"  clocks: {s.clock.kind}; energy {s.clock.energy}; times {s.clock.time}"
                 + (f"; {s.clock.note}" if s.clock.note else ""))
    if s.calibration is not None:
        c = s.calibration.time_s
        lines.append(f"  calibration (1F1B, every clock at max): iteration {_ms(c.median)} (median of {c.n})")
    lines.append(f"  throughput: {s.steady.throughput_samples_per_s:.2f} samples/s ({s.clock.time})"
                 + ("" if s.wall_throughput_samples_per_s is None or not s.clock.time.startswith("simulated") else
                    f"; this machine's wall clock: {s.wall_throughput_samples_per_s:.2f} samples/s (measured)"))
    m = s.measured
    if m is not None:
        lines.append(f"  this run, the plan's iterations vs its interleaved 1F1B all-max iterations "
                     f"(energy {m.energy}, times {s.clock.time}):")
        if m.energy_saving is not None:
            lines.append(f"    energy saving {_spread_pct(m.energy_saving)}")
        lines.append(f"    slowdown {_spread_pct(m.slowdown)}")
    if s.verdict is not None:
        lines.append(f"  no harm (what runs after the pairs): {s.verdict.reason}")
    lines.append(_iterations("plan" if plan is not None and plan.deployed else "steady", s.steady, s.clock.energy))
    if s.baseline is not None:
        lines.append(_iterations("1F1B all-max", s.baseline, s.clock.energy))
    p = s.predicted
    if p is not None:
        band = "" if p.saving_band is None else (
            f" (band {_pct(p.saving_band[0], sign=False)} to {_pct(p.saving_band[1], sign=False)}: the one-clock "
            "path's measured cross-GPU error, A100/A40; not validated on this GPU)")
        lines.append(f"  simulated, the planner's prediction vs its own 1F1B all-max baseline ({p.profile}): "
                     f"energy saving {_pct(p.energy_saving, sign=False)}{band}, slowdown {_pct(p.slowdown)}")
    if s.predicted_iteration_time_s is not None:
        err = "" if s.time_error is None else \
            f"; {_got(s)} {_ms(s.steady.time_s.median)} (error {_pct(s.time_error)})"
        lines.append("  predicted iteration (simulator, anchored on the calibration's untimed 1F1B iterations): "
                     f"{_ms(s.predicted_iteration_time_s)}{err}")
    e = s.energy
    if e is not None:
        per_stage = ", ".join(f"stage {x.stage} {_pct(x.error)}" for x in e.stages)
        lines.append(f"  energy model vs the counter, what ran: predicted {e.predicted_j:.2f} J, {_got(s)} "
                     f"{e.measured_j:.2f} J per iteration, error {_pct(e.error)} ({per_stage})")
    o = s.oracle
    if o is not None:
        lines.append(f"  simulated GPU ({o.source}): a planner knowing its hidden truth saves "
                     f"{_pct(o.energy_saving, sign=False)}; this run's plan, learned by profiling, saves "
                     f"{_pct(o.planner_energy_saving, sign=False)} on the same truth (simulated, both)")
    rh = s.rehearsal
    if rh is not None:
        lines.append(f"  rehearsal (clocks cannot be set here: each unit stretched by its planned clock's extra time, "
                     f"times {rh.time}): slowdown {_spread_pct(rh.slowdown)} against this run's 1F1B all-max "
                     f"iterations; predicted {_pct(rh.predicted_slowdown)} (simulated), off by "
                     f"{100 * rh.error:+.1f} points; energy saving {_pct(rh.predicted_energy_saving, sign=False)} "
                     "predicted only (simulated: a spinning GPU draws idle power)")
        for rs in rh.stages:
            lines.append(f"    stage {rs.stage}: planned stretch {_ms(rs.planned_s)} per iteration, inserted "
                         f"{_ms(rs.inserted_s)}")
    if s.trust is not None:
        lines.append("  predictions: held (calibration settled; time and energy within their bands)" if s.trust.trusted
                     else "  predictions NOT trusted: " + "; ".join(s.trust.reasons))
    r = s.reconfiguration
    if r is not None:
        times = ", ".join(_ms(x.measured_time_s) for x in r.rounds)
        how = ", rehearsed: each unit stretched by its planned clock's extra time" if r.rehearsed else ""
        lines.append(f"  reconfiguration ({r.method}, {_got(s)}{how}): {len(r.rounds)} round(s), iteration {times}; "
                     f"{r.stop_reason}")
    if plan is not None and plan.memory is not None:
        for st, mem in enumerate(plan.memory):
            fits = "no limit" if mem.max_in_flight is None else f"{mem.max_in_flight} fit"
            predicted_peak = mem.predicted_peak_bytes
            lines.append(f"  stage {st} memory (measured): {mem.activation_bytes_per_microbatch / 2**20:.2f} MiB of "
                         f"activations per micro-batch in flight, {fits}; the order keeps {mem.planned_in_flight}"
                         + ("" if predicted_peak is None else f"; predicted peak {predicted_peak / 2**20:.0f} MiB"))
    for why in plan.refused_orders if plan is not None else []:
        lines.append(f"  order not taken: {why}")
    if s.clock.uncontrolled_s:
        lines.append(f"  clock control lost for {s.clock.uncontrolled_s:.1f} s over all ranks (envpipe-clockd "
                     f"restarted; {s.clock.reattaches or 0} new lease(s)): those iterations ran at default clocks")
    if s.clock.refusals:
        first = s.clock.refusals[0]
        lines.append(f"  clock requests refused by the daemon: {len(s.clock.refusals)} "
                     f"(first: rank {first.rank}, {first.mhz} MHz, {first.status} {first.message})")
    if plan is not None and plan.clocks is not None:
        for st, cs in enumerate(plan.clocks):
            lines.append(f"  stage {st} clocks (MHz, execution order): {' '.join(str(c) for c in cs)}")
    lines += _job_lines(s)
    peak = [g.peak_memory_bytes for g in s.gpus]
    if any(p is not None for p in peak):
        lines.append("  peak memory per GPU (measured): " + " / ".join(f"{(x or 0) / 2**20:.0f} MiB" for x in peak))
    lines.append(f"  files: {out / 'summary.json'}, {out / 'report.txt'}, per-iteration lines "
                 f"{out}/iterations.rank*.jsonl, Gantt of the units that ran {out / 'gantt.png'}")
    return "\n".join(lines)


def _job_lines(s: RunSummary) -> list[str]:
    """Data-parallel replicas: per-node energy, replica times, straggler, all-reduce vs simulated tail."""
    job = s.job
    if job.data_parallel < 2:
        return []
    nodes = " / ".join("n/a" if n.energy_per_iteration_j is None else f"{n.energy_per_iteration_j:.1f}"
                       for n in job.nodes)
    times = " / ".join(_ms(r.pipeline_time_s) for r in job.replicas)
    seen = "none" if job.straggler_replica is None else \
        f"replica {job.straggler_replica} (seen in {job.straggler_seen_in})"
    lines = [f"  job: DP{job.data_parallel} x PP{s.stages}, {job.gpus} GPUs on {len(job.nodes)} node(s); energy per "
             f"node ({s.clock.energy}): {nodes} J; plans identical across replicas: "
             f"{job.plans_identical_across_replicas}",
             f"  replicas' units end ({_got(s)}, median): {times}; straggler: {seen}"]
    rule = job.straggler_rule
    if rule is not None:
        lines.append("  straggler rule: " + (
            f"the other replicas run a frontier plan of {_ms(rule.predicted_time_s)} (simulated) within the "
            f"straggler's {_ms(rule.straggler_predicted_time_s)}" if rule.applied else f"not applied ({rule.reason})"))
    for t in job.tails:
        lines.append(f"  stage {t.stage} per replica ({_got(s)}): all-reduce "
                     f"{' / '.join(_ms(x) for x in t.measured_allreduce_s)}, tail "
                     f"{' / '.join(_ms(x) for x in t.measured_tail_s)}; simulated tail {_ms(t.simulated_tail_s)}")
    return lines
