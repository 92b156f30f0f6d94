"""First, do no harm: whether the steady phase keeps what it deployed, measured against this run's own 1F1B all-max
iterations (one rule, one place; no collectives here).

After the comparison pairs (the plan interleaved ABBA with 1F1B all-max iterations), the plan stays only if, over
the pairs, its median time is within the budget and its median energy is not above 1F1B's; otherwise the job runs
1F1B with every clock at max from then on, and the report and the monitor say why.

- Where the plan's clocks run, it is there for its energy, so a slowdown within the pairs' own noise (half their
  interquartile range, at least `TOLERANCE`) is no measured slowdown, and energy must not measure dearer beyond
  that noise either. The reconfiguration phase judges its rounds by the same allowance.
- Where clocks cannot be set, only the plan's order runs, at default clocks. An order saves nothing by itself
  (EnvPipe's measured +2.7 % and +3.5 % iteration time against 1F1B at default clocks on 4 x H200, 2026-11-28),
  so it must measure at least as fast and no dearer, with no allowance: a tie goes to 1F1B.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from envpipe.runtime import summary as S
from envpipe.runtime.measure.iterations import Measure

TOLERANCE = 0.005  # a slowdown this far over budget counts as noise even when the pairs agree closely


def allowance(noise: float) -> float:
    """How far over its budget a measured slowdown may be and still count as within it."""
    return max(TOLERANCE, noise)


def half_iqr(values: Sequence[float]) -> float:
    """Half the interquartile range: the pairs' noise."""
    spread = S.Spread.of(values)
    return 0.0 if spread is None else (spread.q3 - spread.q1) / 2


def judge(pairs: Sequence[tuple[Measure, Measure]], allowed: float, clocks_run: bool, what: str,
          kind: str = "measured") -> S.Verdict:
    """Keep what ran (``what``, in words) or go back to 1F1B all-max, from ``pairs`` of ((plan time, energy),
    (1F1B time, energy)); ``allowed``: the budget's slowdown; ``clocks_run``: the plan's clocks ran (else only its
    order, at default clocks); ``kind``: what the pairs' numbers are ("measured", or "simulated GPU" on CPU).
    Energy is judged where every iteration has one."""
    if not pairs:
        raise ValueError("no comparison pair to judge")
    slowdowns = [p[0] / b[0] - 1.0 for p, b in pairs]
    slowdown, time_noise = statistics.median(slowdowns), half_iqr(slowdowns)
    savings = [1.0 - p[1] / b[1] for p, b in pairs if p[1] is not None and b[1] is not None and b[1] > 0]
    saving = statistics.median(savings) if len(savings) == len(pairs) else None
    if clocks_run:
        time_slack, energy_slack = allowance(time_noise), allowance(half_iqr(savings) if savings else 0.0)
    else:
        time_slack = energy_slack = 0.0
    slower = slowdown > allowed + time_slack
    dearer = saving is not None and saving < -energy_slack
    measured = f"{what}: {100 * slowdown:+.1f} % time" + (
        "" if saving is None else f" and {100 * abs(saving):.1f} % {'less' if saving >= 0 else 'more'} energy")
    measured += f" against this run's 1F1B all-max iterations ({kind}, {len(pairs)} pairs)"
    if not (slower or dearer):
        return S.Verdict(True, what, slowdown, saving, allowed + time_slack, f"{measured}: kept")
    why = " and ".join(x for x, on in ((f"over the {100 * allowed:g} % budget", slower), ("dearer in energy", dearer))
                       if on)
    return S.Verdict(False, what, slowdown, saving, allowed + time_slack,
                     f"{measured}: {why}; running 1F1B with every clock at max")
