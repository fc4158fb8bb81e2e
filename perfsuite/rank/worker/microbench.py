"""Rank side of the ``microbench`` and ``membw`` kinds: time kernels and blocks on one device.

FLOP and byte counts are defined once, pytest side, in
:mod:`perfsuite.core.workloads.microbench`; this module only runs the work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from perfsuite.core.protocol import EngineUnavailable, RankJob, RankReport
from perfsuite.core.workloads.microbench import CopySpec, MicrobenchSpec, matmul_flops
from perfsuite.rank.worker.base import Runner, spec_as
from perfsuite.rank.worker.loop import Step, measure
from perfsuite.rank.worker.runtime import Reporter, WorkerContext

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SEARCH_WARMUP = 3  # calls per shape before timing it, so cuBLAS has picked its kernel


def _repeat(call: Callable[[], Any], times: int) -> Step:
    def step(last: bool) -> None:
        for _ in range(times):
            call()

    return step


def matmul_call(m: int, n: int, k: int, dtype: str, device: torch.device) -> Callable[[], Any]:
    """One ``A @ B`` of the given shape on random data (fp8: e4m3 through ``_scaled_mm``)."""
    if dtype == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        # _scaled_mm wants its second operand column-major.
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device=device, dtype=DTYPES[dtype])
    b = torch.randn(k, n, device=device, dtype=DTYPES[dtype])
    out = torch.empty(m, n, device=device, dtype=DTYPES[dtype])
    return lambda: torch.matmul(a, b, out=out)


def timed_tflops(call: Callable[[], Any], flops: float, iterations: int, ctx: WorkerContext) -> float:
    """Mean TFLOP/s of ``iterations`` calls after a short warmup, from synchronised clocks."""
    for _ in range(SEARCH_WARMUP):
        call()
    ctx.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    ctx.synchronize()
    return flops * iterations / (time.perf_counter() - start) / 1e12


def build_layer(layer: str, hidden: int, heads: int, ffn: int) -> nn.Module:
    """One transformer block from transformers, random weights, training mode (as the seed's source)."""
    from transformers import BertConfig, GPT2Config, T5Config
    from transformers.models.bert.modeling_bert import BertLayer
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.t5.modeling_t5 import T5Block

    if layer == "bert":
        bert = BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn)
        bert._attn_implementation = "sdpa"  # what a full BertModel uses by default
        return BertLayer(bert)
    if layer == "gpt2":
        gpt2 = GPT2Config(n_embd=hidden, n_head=heads, n_inner=ffn)
        gpt2._attn_implementation = "sdpa"
        return GPT2Block(gpt2, layer_idx=0)
    t5 = T5Config(
        d_model=hidden,
        num_heads=heads,
        d_kv=hidden // heads,
        d_ff=ffn,
        use_cache=False,
        is_decoder=layer == "t5_decoder",
        is_encoder_decoder=False,
    )
    return T5Block(t5, layer_idx=0)


def layer_call(spec: MicrobenchSpec, device: torch.device) -> Callable[[], Any]:
    batch, seq, hidden, heads, ffn = spec.shape
    dtype = DTYPES[spec.dtype]
    block = build_layer(spec.layer, hidden, heads, ffn).to(device=device, dtype=dtype)
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype)
    kwargs = {"encoder_hidden_states": x} if spec.layer == "t5_decoder" else {}

    def forward() -> torch.Tensor:
        out = block(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out  # T5Block returns a tuple

    if spec.layer_pass == "fwd":
        return forward
    return lambda: forward().sum().backward()


class MicrobenchRunner(Runner):
    def __init__(self, job: RankJob) -> None:
        super().__init__(job)
        self.spec = spec_as(job, MicrobenchSpec)

    def check(self, ctx: WorkerContext) -> None:
        if self.spec.dtype != "fp8" or ctx.device.type != "cuda":
            return
        capability = torch.cuda.get_device_capability(ctx.device)
        if capability < (8, 9) or not hasattr(torch, "_scaled_mm"):
            raise EngineUnavailable(
                f"fp8 matmuls need compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(ctx.device)} has {capability[0]}.{capability[1]}"
            )

    def run(self, ctx: WorkerContext, reporter: Reporter) -> RankReport:
        spec = self.spec
        # fp32 means full fp32 math; tf32 lets matmuls use TF32 tensor cores.
        torch.set_float32_matmul_precision("high" if spec.dtype == "tf32" else "highest")
        reporter.phase("build")
        detail: dict[str, Any] = {}
        work: dict[str, float] = {}
        if spec.op == "matmul_best":
            reporter.phase("shape search")
            shape, detail["search"] = self.search(ctx)
            detail["best_shape"] = list(shape)
            work["tflops"] = matmul_flops(*shape) * spec.iterations / 1e12
            call = matmul_call(*shape, spec.dtype, ctx.device)
        elif spec.op == "matmul":
            m, n, k = spec.shape
            call = matmul_call(m, n, k, spec.dtype, ctx.device)
        elif spec.op == "vector_mul":
            a = torch.randn(spec.shape[0], device=ctx.device, dtype=DTYPES[spec.dtype])
            out = torch.empty_like(a)
            call = lambda: torch.mul(a, 1.2, out=out)  # noqa: E731 - the seed's `a * 1.2`, without allocating
        else:
            call = layer_call(spec, ctx.device)
        result = measure(_repeat(call, spec.iterations), self.job, ctx, reporter)
        return result.report(ctx.rank, metrics={"peak_mem_mib": result.peak_mem_mib}, step_work=work, detail=detail)

    def search(self, ctx: WorkerContext) -> tuple[tuple[int, int, int], list[dict[str, Any]]]:
        """Time every shape of the search; the fastest and the whole table."""
        table: list[dict[str, Any]] = []
        for m, n, k in self.spec.search:
            call = matmul_call(m, n, k, self.spec.dtype, ctx.device)
            tflops = timed_tflops(call, matmul_flops(m, n, k), self.spec.iterations, ctx)
            table.append({"shape": [m, n, k], "tflops": tflops})
            del call
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
        best = max(table, key=lambda row: row["tflops"])
        m, n, k = best["shape"]
        return (m, n, k), table


class CopyRunner(Runner):
    def __init__(self, job: RankJob) -> None:
        super().__init__(job)
        self.spec = spec_as(job, CopySpec)

    def run(self, ctx: WorkerContext, reporter: Reporter) -> RankReport:
        reporter.phase("build")
        src = torch.randn(self.spec.size_bytes // 4, device=ctx.device)
        dst = torch.empty_like(src)
        result = measure(_repeat(lambda: dst.copy_(src), self.spec.iterations), self.job, ctx, reporter)
        return result.report(ctx.rank, metrics={"peak_mem_mib": result.peak_mem_mib})
