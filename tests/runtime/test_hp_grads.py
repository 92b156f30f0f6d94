"""The batched hand-off of bf16 gradients to BF16_Optimizer's fp32 accumulators (envpipe.runtime.engine.hp_grads)
against DeepSpeed's own per-parameter code as the oracle: the same sums bit for bit, the same bookkeeping."""

from __future__ import annotations

from itertools import chain
from types import SimpleNamespace
from typing import Any

import torch
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
from hypothesis import given, settings
from hypothesis import strategies as st

from envpipe.runtime.engine.hp_grads import batch_hp_grads

# per parameter: its shape, and whether this backward gave it a gradient
PARAMS = st.lists(st.tuples(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.booleans()), min_size=1,
                  max_size=8)


def optimizer(params: list[tuple[list[int], bool]], seed: int, groups: int) -> Any:
    """A BF16_Optimizer's state as DeepSpeed lays it out: per group bf16 parameters, and their fp32 gradient
    accumulators as 1-D views of one flat buffer; some accumulators already hold earlier micro-batches'."""
    g = torch.Generator().manual_seed(seed)
    lps = [torch.zeros(shape, dtype=torch.bfloat16, requires_grad=True) for shape, _ in params]
    for lp, (_, has_grad) in zip(lps, params, strict=True):
        lp.grad = torch.randn(lp.shape, generator=g).bfloat16() if has_grad else None
    split = [lps[i::groups] for i in range(groups)]
    flats = [torch.randn(sum(p.numel() for p in group), generator=g) for group in split]
    grads = [list(torch.split(flat, [p.numel() for p in group])) for flat, group in zip(flats, split, strict=True)]
    return SimpleNamespace(immediate_grad_update=False, autoep_folding_tp_group=None, bf16_groups=split,
                           fp32_groups_gradients=grads, fp32_groups_gradients_flat=flats,
                           fp32_groups_has_gradients=[[False] * len(group) for group in split])


def deepspeeds(opt: Any, clear: bool) -> None:
    for i, group in enumerate(opt.bf16_groups):
        for j, lp in enumerate(group):
            BF16_Optimizer._update_hp_grad(opt, lp, i, j, clear)


@settings(max_examples=60, deadline=None)
@given(PARAMS, st.integers(0, 2**16), st.integers(1, 3), st.booleans())
def test_the_batched_hand_off_is_deepspeeds_bit_for_bit(params, seed, groups, clear) -> None:
    ours, theirs = optimizer(params, seed, groups), optimizer(params, seed, groups)
    assert batch_hp_grads(ours)
    ours.update_hp_grads(clear_lp_grads=clear)
    deepspeeds(theirs, clear)
    for a, b in zip(ours.fp32_groups_gradients_flat, theirs.fp32_groups_gradients_flat, strict=True):
        assert torch.equal(a, b)
    assert ours.fp32_groups_has_gradients == theirs.fp32_groups_has_gradients
    for opt in (ours, theirs):
        for i, group in enumerate(opt.bf16_groups):
            for j, lp in enumerate(group):
                assert getattr(lp, "_hp_grad", None) is (opt.fp32_groups_gradients[i][j] if lp.grad is not None
                                                         else None)
    for lp_a, lp_b in zip(chain(*ours.bf16_groups), chain(*theirs.bf16_groups), strict=True):
        assert (lp_a.grad is None) == (lp_b.grad is None)
        assert lp_a.grad is None or torch.equal(lp_a.grad, lp_b.grad)

def test_it_follows_the_lists_deepspeed_makes_anew_when_it_clears_the_gradients() -> None:
    opt = optimizer([([3], True), ([2, 2], True)], 0, 1)
    batch_hp_grads(opt)
    BF16_Optimizer.clear_hp_grads(opt)  # new fp32_groups_has_gradients lists
    opt.update_hp_grads()
    assert opt.fp32_groups_has_gradients == [[True, True]]
    assert torch.equal(opt.fp32_groups_gradients_flat[0][:3], opt.bf16_groups[0][0].grad.float())


def test_deepspeeds_own_stays_where_it_does_more_than_the_add() -> None:
    for change in ({"immediate_grad_update": True}, {"autoep_folding_tp_group": object()}):
        opt = optimizer([([3], True)], 0, 1)
        vars(opt).update(change)
        assert not batch_hp_grads(opt)
        assert "update_hp_grads" not in vars(opt)
