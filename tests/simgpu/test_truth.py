"""The hidden truth (envpipe.simgpu.truth): stage mapping, unit time and power from the measured table, the tail
rule, the oracle profile."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.profile import Profile
from envpipe.simgpu import JobTruth


@pytest.mark.parametrize(
    ("stages", "table_stages"),
    [(1, [7]), (2, [0, 7]), (3, [0, 4, 7]), (4, [0, 2, 5, 7]), (8, list(range(8))),
     (12, [0, 1, 1, 2, 3, 3, 4, 4, 5, 6, 6, 7])],
)
def test_first_stage_on_the_tables_first_last_on_its_last(stages: int, table_stages: list[int]) -> None:
    job = JobTruth.embedded(stages)
    assert [job.table_stage(s) for s in range(stages)] == table_stages


def test_a_unit_is_its_work_stretched_by_the_measured_curve(bloom: Profile) -> None:
    """Stage 1 of 2 runs the table's last stage (BLOOM on A40): a backward of 20 ms at 1740 MHz lasts
    20 ms x T(1005) / T(1740) at 1005 MHz and draws E(1005) / T(1005) watts, as the A40 measured."""
    truth = JobTruth.embedded(2).stage(1)
    assert truth.table_stage == 7 and truth.clocks_mhz[0] == 1740 and truth.blocking_w == 70.38
    k = bloom.freq_index(1005)
    seconds, watts = truth.unit("B", 1005, 0.020)
    assert seconds == pytest.approx(0.020 * bloom.bwd_time[7, k] / bloom.bwd_time[7, 0])
    assert watts == pytest.approx(bloom.bwd_energy[7, k] / bloom.bwd_time[7, k])
    assert truth.unit("F", 1740, 0.010) == pytest.approx((0.010, bloom.fwd_energy[7, 0] / bloom.fwd_time[7, 0]))
    with pytest.raises(ValueError, match="not a clock of this simulated GPU"):
        truth.unit("F", 1000, 0.01)


def test_tail_power_rule(bloom: Profile) -> None:
    """Blocking power plus 49 % of the backward's power above it, at the clock the stage holds."""
    truth = JobTruth.embedded(1).stage(0)
    busy = bloom.bwd_energy[7, 0] / bloom.bwd_time[7, 0]  # 294.2 W
    assert truth.tail_power_w(1740) == pytest.approx(70.38 + 0.49 * (busy - 70.38))
    assert truth.tail_power_w(1740) == pytest.approx(180.1, abs=0.1)


def test_oracle_is_the_noise_free_truth_at_every_clock(bloom: Profile) -> None:
    job = JobTruth.embedded(2)
    oracle = job.oracle_profile([(1e9, 2e9), (1.2e9, 2.4e9)])
    assert oracle.freqs.tolist() == job.clocks_mhz == bloom.freqs.tolist()
    assert oracle.fwd_time[:, 0].tolist() == pytest.approx([0.010, 0.012])  # FLOPs at 100 GFLOP/s at the top
    np.testing.assert_allclose(oracle.bwd_time[1] / oracle.bwd_time[1, 0], bloom.bwd_time[7] / bloom.bwd_time[7, 0])
    np.testing.assert_allclose(oracle.fwd_energy[0] / oracle.fwd_time[0], bloom.fwd_energy[0] / bloom.fwd_time[0])
    assert "simulated" in oracle.source and "oracle" in oracle.source
    with pytest.raises(ValueError, match="each of the 2 stages"):
        job.oracle_profile([(1e9, 2e9)])


def test_bad_jobs_are_refused() -> None:
    with pytest.raises(ValueError, match="no simulated GPU table 'h100'"):
        JobTruth.embedded(2, "h100")
    with pytest.raises(ValueError, match="at least one stage"):
        JobTruth.embedded(0)
    with pytest.raises(ValueError, match="stage 2 is not a stage of a 2-stage job"):
        JobTruth.embedded(2).stage(2)
