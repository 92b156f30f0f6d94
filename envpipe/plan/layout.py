"""Which part of the model each pipeline stage (GPU) runs: one model stage, or several chunks of it.

With one chunk per stage (1F1B, EnvPipe's orders, GPipe) pipeline stage s runs model stage s. Interleaved
1F1B (Megatron's virtual pipeline) cuts the model into v·P model stages and gives stage s the chunks
s, s + P, ..., s + (v-1)P. DualPipeV (DeepSeek-V3; DeepSpeed's DualPipeVSchedule) cuts it into 2P and
gives rank s model stage s (phase 0, activations flow out) and 2P - 1 - s (phase 1, they flow back), so
a micro-batch turns around on the last rank and rank 0 both starts it and computes its loss.

A profile for a chunked layout has one row per model stage, in model order: measured on a vP-stage cut,
or made from a profile of the P pipeline stages by splitting each stage evenly over its chunks (each
chunk takes 1/v of its stage's time and energy at every clock).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.profile import Profile


@dataclass(frozen=True)
class StageLayout:
    """``model_stage[s][k]``: the model stage that chunk k of pipeline stage s runs."""

    model_stage: tuple[tuple[int, ...], ...]

    @classmethod
    def single(cls, num_stages: int) -> StageLayout:
        return cls(tuple((s,) for s in range(num_stages)))

    @classmethod
    def interleaved(cls, num_stages: int, chunks: int) -> StageLayout:
        return cls(tuple(tuple(k * num_stages + s for k in range(chunks)) for s in range(num_stages)))

    @classmethod
    def v_shape(cls, num_stages: int) -> StageLayout:
        return cls(tuple((s, 2 * num_stages - 1 - s) for s in range(num_stages)))

    @property
    def num_stages(self) -> int:
        return len(self.model_stage)

    @property
    def chunks(self) -> int:
        return len(self.model_stage[0])

    @property
    def num_model_stages(self) -> int:
        return self.num_stages * self.chunks

    def owner(self) -> tuple[np.ndarray, np.ndarray]:
        """(pipeline stage, chunk) of every model stage, indexed by model stage."""
        stage = np.empty(self.num_model_stages, int)
        chunk = np.empty(self.num_model_stages, int)
        for s, model in enumerate(self.model_stage):
            for k, c in enumerate(model):
                stage[c], chunk[c] = s, k
        return stage, chunk


def model_profile(profile: Profile, layout: StageLayout) -> Profile:
    """The profile per model stage: ``profile`` itself if it has one row per model stage, or each of its
    pipeline stages split evenly over the stage's chunks if it has one row per pipeline stage."""
    if profile.num_stages == layout.num_model_stages:
        return profile
    if profile.num_stages != layout.num_stages and layout.chunks == 1:
        raise ValueError(f"the profile has {profile.num_stages} stages, the pipeline {layout.num_stages}")
    if profile.num_stages != layout.num_stages:
        raise ValueError(f"the profile has {profile.num_stages} stages; a pipeline of {layout.num_stages} stages "
                         f"with {layout.chunks} chunks each needs {layout.num_stages} (split evenly) or "
                         f"{layout.num_model_stages} (one per model stage)")
    row, _ = layout.owner()  # model stage c runs on pipeline stage row[c]
    v = layout.chunks
    return Profile(profile.freqs, profile.fwd_time[row] / v, profile.bwd_time[row] / v, profile.fwd_energy[row] / v,
                   profile.bwd_energy[row] / v, profile.source)
