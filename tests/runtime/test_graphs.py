"""Stage units replayed as recordings (envpipe.runtime.engine.graphs), on the CPU recorder that behaves as CUDA
graphs do (tests/support/fakes/graphs.py): same gradients as eager, one recording per micro-batch in flight."""

from __future__ import annotations

import pytest
import torch

from envpipe.runtime.engine.graphs import CudaGraphs, GraphError, StageGraphs
from tests.support.fakes.graphs import CpuGraphs, RecordingOverrun


def stage(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def run(order: list[tuple[str, int]], graphed: bool, wants_input_grad: bool = True
        ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], StageGraphs | None]:
    """Run forwards and backwards of micro-batches in ``order`` as the engine does (buffer = micro-batch): the
    outputs, the inputs' gradients and the parameters' accumulated gradients."""
    module = stage()
    graphs = StageGraphs(module, CpuGraphs()) if graphed else None
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(2, 6, generator=g).requires_grad_(wants_input_grad) for _ in range(8)]
    outs: dict[int, torch.Tensor] = {}
    seen = []  # each output when it was made (a recording's output is rewritten when its slot is reused)
    for kind, mb in order:
        if kind == "F":
            x = data[mb].clone()
            if graphs is None:
                outs[mb] = module(x)
            else:
                with graphs.forward_slot(mb):
                    outs[mb] = module(x)
            seen.append(outs[mb].detach().clone())
        else:
            outs[mb].backward(torch.full_like(outs[mb], 0.1 * (mb + 1)))
            if graphs is not None:
                graphs.backward_done(mb)
    input_grads = [d.grad.clone() for d in data if d.grad is not None]
    return seen, input_grads, [p.grad.clone() for p in module.parameters()], graphs


ONE_F_ONE_B_3 = [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4), ("B", 2), ("B", 3),
                 ("B", 4)]


@pytest.mark.parametrize("order", [ONE_F_ONE_B_3, [(k, m) for m in range(4) for k in "FB"]])
def test_replays_give_what_eager_gives_and_record_once_per_micro_batch_in_flight(order) -> None:
    outs, input_grads, param_grads, _ = run(order, graphed=False)
    g_outs, g_input_grads, g_param_grads, graphs = run(order, graphed=True)
    assert graphs is not None
    for a, b in zip(outs + input_grads + param_grads, g_outs + g_input_grads + g_param_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    in_flight = 3 if order is ONE_F_ONE_B_3 else 1
    assert graphs.recorded == in_flight
    recorder = graphs._recorder
    assert isinstance(recorder, CpuGraphs)
    assert recorder.forward_replays == recorder.backward_replays == len(order) // 2


def test_gradients_accumulate_across_replays_as_they_do_eagerly() -> None:
    """pytorch/pytorch#181723: a returned static buffer becomes .grad and the next replay writes over it."""
    order = [(k, m) for m in range(3) for k in "FB"]
    *_, param_grads, _ = run(order, graphed=False)
    *_, g_param_grads, _ = run(order, graphed=True)
    assert all(torch.equal(a, b) for a, b in zip(param_grads, g_param_grads, strict=True))


def test_inputs_without_gradients_and_evaluation_run_as_they_do_eagerly() -> None:
    order = [(k, m) for m in range(2) for k in "FB"]
    assert all(torch.equal(a, b) for a, b in zip(run(order, False, wants_input_grad=False)[2],
                                                run(order, True, wants_input_grad=False)[2], strict=True))
    module = stage()
    graphs = StageGraphs(module, CpuGraphs())
    x = torch.randn(2, 6)
    with torch.no_grad(), graphs.forward_slot(0):
        evaluated = module(x)
    module.eval()
    with graphs.forward_slot(1):
        module(x)
    assert graphs.recorded == 0
    assert torch.equal(evaluated, stage()(x).detach())


def test_a_forward_of_another_shape_is_refused_in_one_line() -> None:
    module = stage()
    graphs = StageGraphs(module, CpuGraphs())
    with graphs.forward_slot(0):
        module(torch.randn(2, 6)).sum().backward()
    graphs.backward_done(0)
    with pytest.raises(GraphError, match=r"^cuda_graphs: a forward's inputs \(\[3, 6\] float32\) differ from the "
                       r"recorded \(\[2, 6\] float32\)") as err, graphs.forward_slot(0):
        module(torch.randn(3, 6))
    assert "\n" not in str(err.value)


def test_a_slot_reused_before_its_backward_would_corrupt_and_the_cpu_recorder_says_so() -> None:
    """The runtime never does this (a slot is freed at its backward); the recorder catches it if it did."""
    module = stage()
    graphs = StageGraphs(module, CpuGraphs())
    with graphs.forward_slot(0):
        module(torch.randn(2, 6))
    graphs.backward_done(0)  # freed too early
    with pytest.raises(RecordingOverrun), graphs.forward_slot(1):
        module(torch.randn(2, 6))


def test_hooks_of_layers_are_refused_and_cuda_graphs_need_cuda() -> None:
    module = stage()
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))  # the stage's own: around every call, as DeepSpeed's
    graphs = StageGraphs(module, CpuGraphs())
    for mb in range(2):
        with graphs.forward_slot(mb):
            module(torch.randn(2, 6)).sum().backward()
        graphs.backward_done(mb)
    assert calls == [1, 1]
    module[1].register_forward_hook(lambda *_: None)
    with pytest.raises(GraphError, match=r"^cuda_graphs: layer '1' of the stage has hooks, which a recording would "
                       r"run only once$"):
        StageGraphs(module, CpuGraphs())
    assert CudaGraphs().unavailable(torch.device("cpu")) == "CUDA graphs need a CUDA device; this stage runs on cpu"
    assert CudaGraphs().unavailable(torch.device("cuda", 0)) is None


def test_parameters_given_new_storage_are_recorded_again_at_the_next_iteration() -> None:
    """A recording reads the parameters' storage: after ``param.data = ...`` (a checkpoint loaded that way) the
    next iteration records again instead of training on the old values."""
    module, reference = stage(), stage()
    graphs = StageGraphs(module, CpuGraphs())
    x = torch.randn(2, 6)
    for step in range(2):
        if step == 1:
            for p, q in zip(module.parameters(), reference.parameters(), strict=True):
                p.data = torch.full_like(p, 0.5)  # new storage
                q.data = torch.full_like(q, 0.5)
        graphs.new_iteration()
        with graphs.forward_slot(0):
            out = module(x)
        assert torch.equal(out, reference(x).detach())
        out.sum().backward()
        graphs.backward_done(0)
    recorder = graphs._recorder
    assert isinstance(recorder, CpuGraphs) and graphs.recorded == 1
