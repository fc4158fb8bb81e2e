"""Entry point of one rank: ``python -m perfsuite.worker JOB.json`` (under torchrun).

Writes ``rankN.json`` with status ``ok`` and raw measurements, or ``oom`` /
``crash`` / ``skipped`` with the error, so the parent can classify the run even
when torchrun only reports an exit code.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import platform
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from perfsuite.strategies.base import (
    EngineUnavailable,
    Strategy,
    StrategyContext,
    load_strategy,
)
from perfsuite.worker.loop import train
from perfsuite.worker.models import build_model, synthetic_batch
from perfsuite.worker.runtime import (
    Reporter,
    WorkerContext,
    apply_cpu_memory_budget,
    apply_cuda_memory_cap,
    lift_cpu_memory_budget,
    runtime_fingerprint,
)

STACK_DUMP_SIGNAL = signal.SIGUSR1
BATCH_POOL = 2  # distinct synthetic batches cycled through, built before timing


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text or "bad_alloc" in text


def run(
    job: dict[str, Any], strategy_cls: type[Strategy], ctx: WorkerContext, reporter: Reporter
) -> dict[str, Any]:
    scenario, settings = job["scenario"], job["run"]
    sctx = StrategyContext(
        device=ctx.device,
        rank=ctx.rank,
        world_size=ctx.world_size,
        precision=scenario["precision"],
        lr=scenario["lr"],
        grad_accum=scenario["grad_accum"],
        options=scenario["strategy_options"],
    )
    strategy_cls.check(sctx)
    reporter.phase("init")
    ctx.init_process_group()
    # Limits go on after imports and process-group setup, so the budget covers
    # what the scenario allocates rather than the libraries.
    if settings.get("rank_memory_budget_mib") and ctx.device.type == "cpu":
        apply_cpu_memory_budget(settings["rank_memory_budget_mib"])
    if settings.get("device_memory_cap_mib") and ctx.device.type == "cuda":
        apply_cuda_memory_cap(ctx.device, settings["device_memory_cap_mib"])
    torch.manual_seed(settings.get("seed", 0))
    reporter.phase("build")
    model = build_model(scenario).to(ctx.device)
    rows = scenario["micro_batch"] * (scenario["grad_accum"] if strategy_cls.pipelined else 1)
    # All tp x pp ranks of one data-parallel replica train on the same rows.
    replica = ctx.rank // (scenario["layout"]["tp"] * scenario["layout"]["pp"])
    batches = [synthetic_batch(scenario, ctx.device, rows, seed=replica * 1000 + i) for i in range(BATCH_POOL)]
    reporter.phase("wrap")
    strategy = strategy_cls(sctx)
    strategy.setup(model)
    del model  # the strategy holds what it needs; a stray reference skews memory
    result = train(strategy, batches, scenario, ctx, reporter, settings)
    reporter.phase("report")
    # Each node's first rank describes its node, so the fingerprint covers every node.
    return {**result, "host": platform.node(), "runtime": runtime_fingerprint() if ctx.local_rank == 0 else {}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # On timeout the launcher sends this signal to get every rank's Python stack
    # into its stderr before killing it: that is how a hung rank is told apart
    # from the ranks waiting for it in a collective.
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    job = json.loads(Path(argv[0]).read_text())
    # The strategy module is imported before CUDA is touched, so an engine can
    # set environment it needs at context creation (CUDA_DEVICE_MAX_CONNECTIONS).
    strategy_cls = load_strategy(job["scenario"]["strategy"])
    ctx = WorkerContext.from_env(job["run"]["device"])
    reporter = Reporter(Path(job["run"]["reports_dir"]), ctx.rank)
    try:
        report = {"status": "ok", **run(job, strategy_cls, ctx, reporter)}
        code = 0
    except EngineUnavailable as exc:
        report, code = {"status": "skipped", "error": str(exc)}, 0
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported
        gc.collect()  # free the failed step's tensors before writing the report
        lift_cpu_memory_budget()
        traceback.print_exc()
        status = "oom" if is_oom(exc) else "crash"
        report = {"status": status, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        code = 1
    reporter.write(report)
    if code == 0:  # on failure the phase file keeps where the rank failed
        reporter.phase("done")
        if dist.is_initialized():
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
