"""A stage's forward and backward unit time as DeepSpeed's pipeline engine runs its layers, from the layer
profile's host and device times (envpipe.search.layers).

The engine runs a stage's layers one after the other on one stream: the host issues a layer's kernels
(Python, launches) and the device runs them behind it, never ahead. For layer l with host time c_l and
device time g_l, issued by the host from C_{l-1} to C_l = C_{l-1} + c_l, the device is done with it at

    G_l = max(max(G_{l-1}, C_{l-1}) + g_l, C_l)

(it can start once the layer's first kernel is issued and its earlier work is done, and cannot finish
before the last kernel is issued). A device-bound stage adds up its g's, a launch-bound one its c's; a
stage whose layers differ lies between, which no sum of per-layer numbers gets right. Within a layer the
host issues its kernels in bursts between Python work, so where host and device take about as long the
device waits now and then even with the host ahead on average: the profile's repeat time r_l (the
layer's units back to back, as the engine runs a stage of such layers) is then above max(c_l, g_l), and
the difference joins the layer's device time, g_l + max(0, r_l - max(c_l, g_l)), so that a stage of equal
layers takes r_l per layer.

Once per micro-batch and stage, not per layer (``UnitCalls`` of the profile, measured there): the engine
calls ``backward()`` once over the stage and DeepSpeed's BF16_Optimizer zeroes all of its gradients at once.
The layers' backward host and repeat times carry none of it (layer profile version 4 measures them inside one
``backward()``; version 3's are read without it), and the stage's backward pays it once, as host work before
its first layer's kernels (``stage_calls_s``).

Across micro-batches there is no overlap: the engine waits for an idle device before every forward (the
micro-batch's copy to the device from pageable memory waits for the stream; DeepSpeed's throughput timer,
`timers.throughput.synchronized`, on by default, synchronizes the device at the start of every forward
pass once the first two iterations are done). So a forward unit starts on an idle device, after the
micro-batch's load (``load_s``: the profile's, on the stages that read data) and the engine's own host work
for the unit (``EngineModel.unit_host_s``); its backward's host work follows at once, overlapping the
forward's last kernels. The forward unit lasts until its last layer is done on the device, the backward
from there until the backward is done. The host's times are the profile's scaled by
``EngineModel.host_scale`` (1 unless fitted otherwise: how the host's time for a layer in the engine's stage
loop compares with the profiler's). On the CPU's simulated GPU host times, calls and the engine's host work
are 0, and unit times are plain sums.

Units replayed as CUDA graphs (``graphed``: envpipe.runtime.engine.graphs) are issued by one launch each: the
device runs the layers back to back at its own pace, so a forward unit takes the micro-batch's load, the
engine's host work and its layers' device times, and a backward unit its layers' device times, or the host's
calls it still makes (``stage_calls_s``: the ``backward()`` call, the gradients' hand-off) if they take longer.
On one H200 (benchmarks/results/graphed_runtime_h200.md) graphed forward and backward units of two models at
micro-batches 1 to 16 took their layers' summed device times to within 5 % wherever the host's work per
parameter did not set the pace.
"""

from __future__ import annotations

from collections.abc import Sequence

from envpipe.search.engine_model import EngineModel
from envpipe.search.layers import LayerCost


def issue(host_s: Sequence[float], device_s: Sequence[float], host_t: float = 0.0, device_t: float = 0.0
          ) -> tuple[float, float]:
    """Issue layers with these host and device times from host time ``host_t`` on a device busy until
    ``device_t``: (when the host is done issuing, when the device is done)."""
    for c, g in zip(host_s, device_s, strict=True):
        start = host_t
        host_t += c
        device_t = max(max(device_t, start) + g, host_t)
    return host_t, device_t


def unit_times(costs: Sequence[LayerCost], engine: EngineModel, stage_calls_s: float = 0.0, load_s: float = 0.0,
               graphed: bool = False) -> tuple[float, float]:
    """(forward, backward) unit time of a stage whose layers have ``costs`` (in pipeline order), with
    ``stage_calls_s`` the host's calls the engine's backward pays once (``UnitCalls.backward_s``), ``load_s``
    the micro-batch's load before each forward (0 on a stage that reads no data); the host's times as the
    engine's stage loop takes them (``EngineModel.host_scale``); ``graphed``: replayed as CUDA graphs."""
    k = engine.host_scale
    if graphed:
        return (load_s + engine.unit_host_s + sum(c.forward_s for c in costs),
                max(sum(c.backward_s for c in costs), k * stage_calls_s))
    host = [k * c.forward_host_s for c in costs]
    issued, done = issue(host, _device(host, [c.forward_s for c in costs], [c.forward_repeat_s for c in costs]),
                         load_s + engine.unit_host_s)
    back = costs[::-1]
    host = [k * c.backward_host_s for c in back]
    repeat = [c.backward_repeat_s for c in back]
    _, end = issue(host, _device(host, [c.backward_s for c in back], repeat), issued + k * stage_calls_s, done)
    return done, end - done


def _device(host_s: Sequence[float], device_s: Sequence[float], repeat_s: Sequence[float]) -> list[float]:
    """Each layer's device time with what host and device cannot overlap within it (see the module's docstring)."""
    return [g + max(0.0, r - max(c, g)) for c, g, r in zip(host_s, device_s, repeat_s, strict=True)]


def layer_weight(cost: LayerCost, graphed: bool = False) -> float:
    """One layer's share of a stage's forward and backward time, for choosing cuts: additive, so that the
    dynamic program can sum it, and launch-aware (per unit the slowest of host, device and back to back;
    ``graphed``: the device's)."""
    if graphed:
        return cost.forward_s + cost.backward_s
    return (max(cost.forward_s, cost.forward_host_s, cost.forward_repeat_s)
            + max(cost.backward_s, cost.backward_host_s, cost.backward_repeat_s))
