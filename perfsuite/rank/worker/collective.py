"""Rank side of the ``collective`` workload kind: time back-to-back collectives."""

from __future__ import annotations

import torch
import torch.distributed as dist

from perfsuite.core.protocol import RankJob, RankReport
from perfsuite.core.workloads.collective import ELEMENT_BYTES, CollectiveSpec
from perfsuite.rank.worker.base import Runner, spec_as
from perfsuite.rank.worker.loop import Step, measure
from perfsuite.rank.worker.runtime import Reporter, WorkerContext

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class CollectiveRunner(Runner):
    def __init__(self, job: RankJob) -> None:
        super().__init__(job)
        self.spec = spec_as(job, CollectiveSpec)

    def step(self, ctx: WorkerContext) -> Step:
        """One step: ``iterations`` collectives on buffers allocated once, up front."""
        spec = self.spec
        elements = spec.size_bytes // ELEMENT_BYTES[spec.dtype]
        dtype = DTYPES[spec.dtype]
        whole = torch.ones(elements, dtype=dtype, device=ctx.device)
        part = torch.ones(elements // spec.world_size, dtype=dtype, device=ctx.device)
        calls = {
            "all_reduce": lambda: dist.all_reduce(whole),
            "all_gather": lambda: dist.all_gather_into_tensor(whole, part),  # S = the gathered output
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, whole),  # S = the scattered input
        }
        call = calls[spec.op]

        def step(last: bool) -> None:
            for _ in range(spec.iterations):
                call()

        return step

    def run(self, ctx: WorkerContext, reporter: Reporter) -> RankReport:
        reporter.phase("build")
        result = measure(self.step(ctx), self.job, ctx, reporter)
        return result.report(ctx.rank, metrics={"peak_mem_mib": result.peak_mem_mib})
