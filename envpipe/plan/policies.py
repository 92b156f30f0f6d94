"""EnvPipe's clock policies: baseline, uniform and envelope, and the energy-valley clock per stage.

The valley clock follows EnvPipe's profiler: it sweeps one clock at a time over all non-last stages
(1F1B order, last stage at max unless the policy is uniform) and takes, per stage, the clock with
the least *iteration* energy of that stage's GPU: its unit energies plus its idle time at the
blocking power. Here the sweep is simulated on the profile instead of run on the GPUs.
"""

from __future__ import annotations

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import unit_costs
from envpipe.plan.schedules import one_f_one_b
from envpipe.plan.simulate import simulate

POLICIES = ("baseline", "uniform", "envelope")


def valley_clocks(case: PipelineCase, candidates: list[int], sweep_last_stage: bool) -> list[int]:
    """Per-stage energy-optimal clock among ``candidates`` (EnvPipe's f_opt), on a case with one model stage
    per pipeline stage.

    The case's tails lengthen every swept iteration; each stage's energy charges its waits at its blocking
    power and its tail at its tail power (envpipe.plan.simulate).
    """
    profile, S, M = case.profile, case.num_stages, case.num_microbatches
    dag = PipelineDag.from_orders(one_f_one_b(S, M), M)
    last = dag.stage == S - 1
    stage_energy = np.empty((len(candidates), S))
    for c, f in enumerate(candidates):
        k = profile.freq_index(f)
        freq_idx = np.full(dag.num_units, k)
        if not sweep_last_stage:
            freq_idx[last] = 0
        dur, en = unit_costs(dag, profile, freq_idx)
        stage_energy[c] = simulate(dag, dur, en, case.overheads).stage_energy
    best = np.argmin(stage_energy, axis=0)
    valley = [candidates[int(b)] for b in best]
    if not sweep_last_stage:
        valley[S - 1] = profile.f_max
    return valley


def is_envelope(dag: PipelineDag) -> np.ndarray:
    """EnvPipe's fixed outer envelope: F0 of every stage, the last stage, B(M-1) of every stage."""
    M = dag.num_microbatches
    return (dag.stage == dag.num_stages - 1) | (dag.is_fwd & (dag.mb == 0)) | (~dag.is_fwd & (dag.mb == M - 1))


def initial_clocks(policy: str, dag: PipelineDag, f_max: int, valley: list[int]) -> np.ndarray:
    """Per-unit clock (MHz) of a policy before any reconfiguration."""
    if policy == "baseline":
        return np.full(dag.num_units, f_max)
    per_unit_valley = np.asarray(valley)[dag.stage]
    if policy == "uniform":
        return per_unit_valley
    if policy == "envelope":
        return np.where(is_envelope(dag), f_max, per_unit_valley)
    raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
