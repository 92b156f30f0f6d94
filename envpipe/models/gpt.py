"""GPT-style models as DeepSpeed pipeline layers: Hugging Face's GPT-2 or Llama blocks, randomly initialised (only
configurations are built, nothing is downloaded), one pipeline layer per block between an embedding and a head;
and a synthetic task they learn (counting sequences).

The shape is `envpipe.search.layers.ModelShape`, the one the layer profiler records and the search hands back
in a found configuration, so that the model profiled, searched and trained is one and the same
(examples/train_gpt.py, benchmarks/search_run.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from deepspeed.pipe import LayerSpec, PipelineModule

from envpipe.search.layers import ModelShape


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




def model_config(shape: ModelShape) -> Any:
    """The Hugging Face config of the shape's family (GPT2Config or LlamaConfig)."""
    if shape.family == "gpt2":
        from transformers import GPT2Config

        cfg: Any = GPT2Config(n_embd=shape.hidden, n_layer=shape.layers, n_head=shape.heads, n_positions=shape.seq,
                              vocab_size=shape.vocab, bos_token_id=0, eos_token_id=0)
    else:
        from transformers import LlamaConfig

        cfg = LlamaConfig(hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                          num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                          num_key_value_heads=shape.heads, vocab_size=shape.vocab,
                          max_position_embeddings=shape.seq, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return cfg


def layer_specs(shape: ModelShape) -> list[LayerSpec]:
    """The pipeline's layers: embedding, one per transformer block, head (shape.layers + 2)."""
    cfg = model_config(shape)
    layers = [LayerSpec(Embedding, cfg, shape.family == "gpt2")]
    layers += [LayerSpec(Block, cfg, shape.family, i) for i in range(shape.layers)]
    layers.append(LayerSpec(Head, cfg, shape.family))
    return layers


def pipeline(shape: ModelShape, stages: int, stage_layers: list[int] | None = None) -> PipelineModule:
    """The model as a PipelineModule of ``stages`` stages: DeepSpeed balances the blocks, or ``stage_layers[s]``
    consecutive layers on stage s."""
    layers = layer_specs(shape)
    if stage_layers:
        return CutPipelineModule(stage_layers, layers=layers, num_stages=stages, loss_fn=lm_loss)
    return PipelineModule(layers=layers, num_stages=stages, loss_fn=lm_loss, partition_method="type:Block")


def counting(shape: ModelShape, micro_batch: int, device: Any, seed: int = 0
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Counting sequences: a random start, a stride of 1, 2 or 3 (mod the vocabulary); inputs and next tokens.
    Every next token follows from the ones before, so the loss falls as the model learns the task."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.arange(shape.seq + 1)
    while True:
        start = torch.randint(0, shape.vocab, (micro_batch, 1), generator=g)
        stride = torch.randint(1, 4, (micro_batch, 1), generator=g)
        ids = (start + stride * steps) % shape.vocab
        yield ids[:, :-1].to(device), ids[:, 1:].to(device)
