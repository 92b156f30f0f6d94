"""The GPT example's pipeline layers (examples/train_gpt.py): embedding, one transformer block of the chosen
Hugging Face family per layer, head, the language-model loss, and a PipelineModule with an explicit stage cut."""

from __future__ import annotations

import torch
from deepspeed.pipe import PipelineModule


class Embedding(torch.nn.Module):
    """Token (+ learned position for GPT-2) embeddings: input ids -> hidden states."""

    def __init__(self, cfg, learned_positions: bool) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.tokens = torch.nn.Embedding(cfg.vocab_size, hidden)
        self.positions = (
            torch.nn.Embedding(cfg.max_position_embeddings, hidden) if learned_positions else None
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tokens(ids)
        if self.positions is not None:
            h = h + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return h


class Block(torch.nn.Module):
    """One transformer block of the chosen family: hidden states -> hidden states (causal)."""

    def __init__(self, cfg, family: str, index: int) -> None:
        super().__init__()
        self.block: torch.nn.Module
        if family == "gpt2":
            from transformers.models.gpt2.modeling_gpt2 import GPT2Block

            self.block, self.rotary = GPT2Block(cfg, layer_idx=index), None
        else:
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

            self.block, self.rotary = LlamaDecoderLayer(cfg, layer_idx=index), LlamaRotaryEmbedding(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.rotary is None:
            out = self.block(h)
        else:
            pos = torch.arange(h.shape[1], device=h.device)[None]
            out = self.block(h, position_embeddings=self.rotary(h, pos), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, cfg, family: str) -> None:
        super().__init__()
        self.norm = (
            torch.nn.LayerNorm(cfg.hidden_size) if family == "gpt2" else torch.nn.RMSNorm(cfg.hidden_size)
        )
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class CutPipelineModule(PipelineModule):
    """A PipelineModule with an explicit stage cut: ``counts[s]`` consecutive layers on stage s (DeepSpeed's
    `parts` boundaries, given instead of computed by a partition method)."""

    def __init__(self, counts: list[int], **kwargs) -> None:
        self._counts = list(counts)
        super().__init__(**kwargs)

    def _partition_layers(self, method: str = "uniform") -> None:
        self.parts = [sum(self._counts[:s]) for s in range(len(self._counts) + 1)]
        if self.global_rank == 0:  # as DeepSpeed's own partitioning reports it
            print(" ".join(f"stage={s} layers={c}" for s, c in enumerate(self._counts)))
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


