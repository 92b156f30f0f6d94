"""The profile phase: the stage profile the planner plans on (every rank takes part).

Where clocks can be changed: one 1F1B iteration at each of `profile_points` clocks spread over the supported
ones, per stage its slowest replica's unit times and energies (the energy from the meter at unit
boundaries); a curve fitted to them per stage and kind (envpipe.profile.clockfit, power-cap aware) gives
every other supported clock in between, so the planner may use any of them. Where they cannot (a GPU
without the clock daemon): the calibration's units at default clocks become each stage's column at its
effective clock, lower clocks from the frequency model (simulated, envpipe.profile.from_measured, power-cap
aware). A profile file skips this; a plan file and EnvPipe's `baseline` need none.
"""

from __future__ import annotations

import numpy as np

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import one_f_one_b
from envpipe.profile import Profile, load_profile
from envpipe.profile.clockfit import profile_clocks
from envpipe.profile.from_measured import profile_from_clocks, profile_from_measured
from envpipe.runtime.decision import CalibrationResult
from envpipe.runtime.measure import replicas
from envpipe.runtime.measure.collective import progress
from envpipe.runtime.measure.iterations import BASELINE
from envpipe.runtime.rig import EnergySplit, Phase, Rig, Step


def stage_profile(rig: Rig, calibrated: CalibrationResult) -> Phase[Profile | None]:
    """The profile to plan on, or None where nothing is to be planned."""
    cfg, clock = rig.cfg, rig.clock
    if cfg.plan or (cfg.type == "baseline" and not cfg.profile):
        return None
    if cfg.profile:
        return load_profile(cfg.profile)
    if clock is None or rig.meter is None:  # config.parse refuses clock 'none' with such a policy
        raise ValueError(f"policy '{cfg.type}' needs a profile: no clock and no energy counter to measure one")
    if not rig.controls:
        u = calibrated.unit_energies
        if any(np.isnan(x.units.fwd_j) or np.isnan(x.units.bwd_j) for x in u):
            raise ValueError("the energy counter gave no unit energies in calibration: nothing to plan from")
        progress("profile: clocks cannot be changed here; lower clocks from the frequency model (simulated)")
        return profile_from_measured([x.units.fwd_s for x in u], [x.units.bwd_s for x in u],
                                     [x.units.fwd_j for x in u], [x.units.bwd_j for x in u], clock.supported_mhz,
                                     effective_mhz=calibrated.report.effective_clock_mhz)
    clocks = profile_clocks(clock.supported_mhz, cfg.profile_points)
    progress(f"profile: one 1F1B iteration at each of {', '.join(map(str, clocks))} MHz")
    orders, timings = one_f_one_b(rig.P, rig.M), []
    for mhz in clocks:
        m = yield Step(Plan.at_one_clock(orders, mhz, "1f1b", "profile"), f"profile@{mhz}", BASELINE)
        timings.append(m.timing)
    # after the last: the clocks ran back to back; waits charged as in calibration
    splits = [rig.energy(t, calibrated.waiting_power_of(rig.place.rank)) for t in timings]
    rows = []
    for gathered in rig.gather_each([(t, EnergySplit.unit_means(x)) for t, x in zip(timings, splits, strict=True)]):
        its = [[(w, t) for w, (t, _) in gathered]]
        entries = replicas.stage_entries(replicas.calibrate_replicas(orders, its), its[-1])
        rows.append([st.units for st in replicas.slowest_with_energy(entries, [[e for _, (_, e) in gathered]], rig.P)])
    return profile_from_clocks(clocks, rows, "online", predict_mhz=clock.supported_mhz,
                               effective_mhz=calibrated.report.effective_clock_mhz)
