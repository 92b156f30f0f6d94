"""DeepSpeed's BF16_Optimizer hand-off of a micro-batch's gradients to its accumulators, in one multi-tensor add
instead of a Python loop over the parameters; every EnvPipe engine with that optimizer uses it.

After every backward the pipeline engine calls ``BF16_Optimizer.update_hp_grads``, which adds each bf16
parameter's gradient to its accumulator one parameter at a time: a few tens of microseconds of Python and
a few kernel launches per parameter tensor. With the stage's units replayed as CUDA graphs
(envpipe.runtime.engine.graphs) that loop was most of what the host still did in a backward: on one H200
(2026-11-29) a 32-block GPT-2's graphed backward unit at micro-batch 1 took 23.4 ms with it
(benchmarks/results/graphed_runtime_h200.md) and 11.2 ms with the batched add
(benchmarks/results/search_accuracy_call7.md), against 12.5 ms of its layers' device time in the profile, which
now times its accumulation the same way (envpipe.layerprof.profiler). ``batch_hp_grads`` gives the optimizer an
``update_hp_grads`` with the same effect (the same sums, bit for bit: each accumulator plus its gradient,
promoted to the accumulator's dtype; the same bookkeeping, ``_hp_grad`` and ``fp32_groups_has_gradients``) from
one ``torch._foreach_add_``.

It leaves DeepSpeed's own where that does more than the add: ``immediate_grad_update`` (its hooks add as the
backward runs) and expert folding across tensor-parallel ranks (``autoep_folding_tp_group``).
"""

from __future__ import annotations

from typing import Any

import torch


def batch_hp_grads(optimizer: Any) -> bool:
    """Give a BF16_Optimizer ``optimizer`` the batched ``update_hp_grads`` (see the module's docstring); False,
    and nothing changed, where DeepSpeed's own must stay."""
    if optimizer.immediate_grad_update or getattr(optimizer, "autoep_folding_tp_group", None) is not None:
        return False
    # looked up at every call: DeepSpeed gives fp32_groups_has_gradients new lists when it clears the gradients
    params = [(i, j, lp) for i, group in enumerate(optimizer.bf16_groups) for j, lp in enumerate(group)]

    @torch.no_grad()
    def update_hp_grads(clear_lp_grads: bool = False) -> None:
        present = [(i, j, lp, optimizer.fp32_groups_gradients[i][j]) for i, j, lp in params if lp.grad is not None]
        if not present:
            return
        torch._foreach_add_([hp for *_, hp in present], [lp.grad.view(hp.shape) for *_, lp, hp in present])
        for i, j, lp, hp in present:
            lp._hp_grad = hp
            optimizer.fp32_groups_has_gradients[i][j] = True
        if clear_lp_grads:
            torch._foreach_zero_([lp.grad for _, _, lp, _ in present])

    optimizer.update_hp_grads = update_hp_grads
    return True
