"""A simulated GPU the planner cannot see into: on CPU, the runtime trains against it as it would a real one.

- `cost`: the one rule that turns counted work into seconds at the highest clock (FLOPs at a fixed nominal
  rate; optimizer steps and messages by their bytes), and the simulated link.
- `flops`: `FlopCount`, torch's FLOP counter around a unit (torch imported only when a count starts).
- `truth`: the hidden ground truth (a real measured clock-swept table mapped onto the job's stages) and the
  oracle profile a planner with the whole table would plan on.
- `gpu`: `SimGpu`, one GPU's clock, virtual time, link arrivals, units, tail, blocking and exact energy
  counter, every unit's time and power drawn from the truth with seeded noise.

Every number from here is **simulated**. Pure: numpy only (and envpipe.profile, envpipe.energy); nothing in
envpipe.plan or envpipe.profile imports it.
"""

from envpipe.simgpu.cost import LINK, NOMINAL_FLOPS_PER_S, Link, step_s, unit_s
from envpipe.simgpu.flops import FlopCount
from envpipe.simgpu.gpu import SimGpu
from envpipe.simgpu.truth import JobTruth, StageTruth

__all__ = ["LINK", "NOMINAL_FLOPS_PER_S", "FlopCount", "JobTruth", "Link", "SimGpu", "StageTruth", "step_s",
           "unit_s"]
