"""Periodic folding of an iteration DAG, so that the LP relaxation's size does not grow with M.

In every pipeline schedule the middle micro-batches repeat one pattern: after the warm-up and before
the cool-down, stage s runs the same units of micro-batch m + L as of micro-batch m, one period later
(L = 1 for 1F1B, EnvPipe's orders, GPipe and DualPipeV; L = P for interleaved 1F1B, whose chunks cycle
through groups of P micro-batches). The LP optimum shares that structure: its durations of the middle
micro-batches are the same from one period to the next (docs/optimal-planner.md shows a measured case).

A fold keeps the warm-up, the cool-down and a margin after and before them as they are and lets every
middle unit share the variables of its representative in the first middle period: the same duration, and a
start time shifted by a whole number of periods ``tau``. For EnvPipe's orders the periods may differ
between stages (``drift``): a stage that ran extra warm-up forwards is ahead, and the LP optimum spends
that lead by running it slower than its neighbours over the whole middle (a linear drift), which one
common period would forbid (measured: up to 2 points of saving lost); for 1F1B one period gives the
full LP's value. The folded LP is a *restriction* of the full one: each of its solutions is a
schedule of the full DAG (envpipe.plan.optimal.lp keeps, of each family of edges that fold together, the two
extreme rows, which imply the others), so its durations meet the budget, but its value is not a lower
bound. Its size is that of a pipeline with a steady section of one period, whatever M is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.plan.dag import PipelineDag


@dataclass(frozen=True)
class Fold:
    rep: np.ndarray  # (N,) folded index of each unit
    shift: np.ndarray  # (N,) periods of its stage by which the unit starts after its representative
    unit: np.ndarray  # (R,) a unit of each folded index (its representative)
    clock_of: np.ndarray  # (N,) which period variable tau the unit's shift counts in (its stage's, or one for all)
    num_periods: int  # how many period variables

    @property
    def size(self) -> int:
        return int(self.unit.size)

    @property
    def weight(self) -> np.ndarray:
        """(R,) how many units share each folded index (their costs add up)."""
        return np.bincount(self.rep, minlength=self.size)

    @property
    def is_identity(self) -> bool:
        return self.size == self.rep.size


def identity_fold(num_units: int) -> Fold:
    units = np.arange(num_units)
    return Fold(units, np.zeros(num_units, int), units, np.zeros(num_units, int), 1)


def periodic_fold(dag: PipelineDag, period: int, margin: int, drift: bool) -> Fold:
    """Fold each (stage, chunk, kind)'s steady micro-batches onto their first period.

    A stage's steady section runs from its first backward to its last forward (after the warm-up, before
    the cool-down); the micro-batches a class runs there, less ``margin`` at each end for the transient,
    fold if they span at least two periods. ``drift``: one period variable per stage (orders with extra
    warm-up forwards need it), else one for all, which the LP solves about three times faster."""
    M = dag.num_microbatches
    lo = np.full(dag.num_units // M, M)  # per class (block of M units numbered by micro-batch)
    hi = np.full(dag.num_units // M, -1)
    for ids in dag.order:
        fwd = dag.is_fwd[list(ids)]
        first_b, last_f = int(np.argmin(fwd)), len(ids) - 1 - int(np.argmax(fwd[::-1]))
        steady = np.asarray(ids[first_b:last_f + 1], int)
        np.minimum.at(lo, steady // M, dag.mb[steady])
        np.maximum.at(hi, steady // M, dag.mb[steady])
    head = (lo + margin)[np.arange(dag.num_units) // M]
    periods = ((hi - lo + 1 - 2 * margin) // period)[np.arange(dag.num_units) // M]
    offset = dag.mb - head  # position in the class's window
    middle = (periods >= 2) & (offset >= period) & (offset < periods * period)  # folded onto the first period
    if not middle.any():
        return identity_fold(dag.num_units)
    shift = np.where(middle, offset // period, 0)
    # units of one class are numbered by micro-batch: the representative is `period * shift` before
    target = np.arange(dag.num_units) - period * shift
    kept = ~middle
    folded_index = np.cumsum(kept) - 1
    clock_of = dag.stage if drift else np.zeros(dag.num_units, int)
    return Fold(folded_index[target], shift, np.flatnonzero(kept), clock_of, dag.num_stages if drift else 1)
