"""Stock DeepSpeed's iterations, timed and metered the way EnvPipe's steady iterations are, for comparisons.

    recorder = StockRecorder(engine, report_dir)     # engine from deepspeed.initialize
    for step in range(steps):
        loss = recorder.train_batch(data_iter)       # engine.train_batch, timed (and its NVML energy on GPUs)
    summary = recorder.finish()                      # rank 0: the same RunSummary type as EnvPipe's runs

The energy is the same NVML counter, interpolated at iteration boundaries, so a stock run and an EnvPipe
run of the same script compare (the benchmarks run each in a process of its own). On CPU there is no
counter and no simulated GPU: times are the wall clock's, energy is absent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from envpipe.runtime.clocks import NvmlEnergyClock, make_meter
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.measure import collective
from envpipe.runtime.measure.iterations import BASELINE
from envpipe.runtime.report.collect import RankRecord, Reported, assemble
from envpipe.runtime.report.files import write_report
from envpipe.runtime.summary import RunSummary

ENGINE = "stock-deepspeed-1f1b"


class StockRecorder:
    def __init__(self, engine: Any, report_dir: str | Path, warmup: int = 2) -> None:
        self.engine, self.report_dir, self.warmup = engine, Path(report_dir), warmup
        self.on_gpu = engine.device.type == "cuda"
        self.clock = NvmlEnergyClock(engine.device.index or 0, "stock DeepSpeed: clocks left as they are") \
            if self.on_gpu else None
        self.meter = make_meter(self.clock)
        self.spans: list[tuple[float, float, float]] = []  # (start, end, wall clock at the end) after warm-up
        self.calls = 0

    def train_batch(self, data_iter: Any = None) -> Any:
        t0 = time.perf_counter()
        loss = self.engine.train_batch(data_iter)
        if self.on_gpu:
            torch.cuda.synchronize()
        if self.calls >= self.warmup:
            self.spans.append((t0, time.perf_counter(), time.time()))
        self.calls += 1
        return loss

    def finish(self) -> RunSummary | None:
        """Every rank's iterations to rank 0, which writes and returns the summary (a collective call)."""
        if not self.spans:
            raise ValueError(f"no measured iteration: the stock run needs more than {self.warmup} steps")
        joules: list[float | None] = [None] * len(self.spans)
        if self.meter is not None and self.meter.wait_until(self.spans[-1][1]):
            joules = [float(self.meter.trace.between(a, b)) for a, b, _ in self.spans]
        steady = [(BASELINE, b - a, j) for (a, b, _), j in zip(self.spans, joules, strict=True)]
        peak = torch.cuda.max_memory_allocated() if self.on_gpu else None
        record = RankRecord(collective.place(self.engine), steady, peak, None, [], "stock", [], [], [])
        everyone = collective.gather(record)
        for closing in (self.meter, self.clock):
            if closing is not None:
                closing.close()
        if collective.rank() != 0:
            return None
        reported = Reported(ENGINE, BASELINE, int(self.engine.train_batch_size()), int(self.engine.micro_batches),
                            [w for *_, w in self.spans])
        summary = assemble(everyone, EnvPipeConfig(), self.clock, None, reported)
        write_report(self.report_dir, summary)
        return summary
