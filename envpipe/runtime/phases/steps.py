"""How many `train_batch()` calls a run needs before its whole report exists, from its configuration.

The report starts with the steady phase's first iteration and is complete (the measured saving over every
comparison pair) at the end of the comparison window (envpipe.runtime.phases.steady). Before it, at most:
calibration's iterations (until settled, then the untimed ones: envpipe.runtime.phases.calibrate), one iteration per
profiled clock (envpipe.runtime.phases.profiling), every reconfiguration round (the optimal policy's re-plans run
ROUND_PAIRS plan/baseline pairs a round, rehearsed ones after a warm-up and with ROUND_PAIRS timed 1F1B
iterations, EnvPipe's raises one iteration; envpipe.runtime.phases.reconfigure), a rehearsal's warm-up and pairs
(envpipe.runtime.phases.rehearse), and one warm-up iteration of a new order. A loop of this many steps (the CML
notebook's default) ends with a report whatever the phases take.
"""

from __future__ import annotations

from envpipe.runtime.config import REPLAN, EnvPipeConfig
from envpipe.runtime.phases.calibrate import ANCHOR_MOST
from envpipe.runtime.phases.reconfigure import ROUND_PAIRS

WARMUP = 1  # a new order's first iteration (envpipe.runtime.phases.steady)


def steps_to_report(cfg: EnvPipeConfig) -> int:
    """The most iterations before the whole report of a run configured by ``cfg`` is written (an upper bound:
    reconfiguration often stops after its first round)."""
    rehearsed = WARMUP + ROUND_PAIRS if cfg.rehearse else 0  # a new order's warm-up, the timed 1F1B iterations
    per_round = {REPLAN: 2 * ROUND_PAIRS + rehearsed, "default": 0}.get(cfg.reconfig_method, 1)
    rehearsal = WARMUP + 2 * max(1, cfg.compare_iterations) if cfg.rehearse else 0
    return (cfg.calibration_range[1] + ANCHOR_MOST + cfg.profile_points + cfg.reconfigure_rounds * per_round
            + rehearsal + WARMUP + 2 * cfg.compare_iterations)
