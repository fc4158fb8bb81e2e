"""Workload kinds ``microbench`` and ``membw``: what one GPU (or CPU) delivers.

``microbench`` times compute-bound kernels and reports TFLOP/s (metric
``tflops``); ``membw`` times a device-to-device copy and reports memory
bandwidth (metric ``mem_gbps``). One rank each: these are per-device ceilings.

Operations and how their FLOPs are counted (multiply-adds count as 2; the
formula is also in every result's config as ``flops_formula``):

* ``matmul``: ``C = A @ B`` with A m x k and B k x n, random data: ``2*m*n*k``.
  ``tf32`` is fp32 storage with TF32 tensor-core math allowed; ``fp8`` is
  e4m3 inputs through ``torch._scaled_mm`` (GPUs of compute capability 8.9+).
* ``matmul_best``: the best-shape search of ml-engineering's MAMF finder. The
  ranks time every (m, n, k) of ``search`` (warmup, then the mean of
  ``iterations`` calls, random data), pick the fastest, and measure that shape
  like ``matmul``; the table of every shape is kept in the results.
* ``vector_mul``: ``a * 1.2`` over ``n`` elements: ``n`` FLOPs (memory-bound:
  the seed's point is how far it stays from the peak).
* ``layer``: one transformer block from transformers (BERT, GPT-2, T5 encoder,
  T5 decoder with cross-attention), forward or forward+backward, with the
  counting of the seed's source (mli/transformers-benchmarks): FFN
  ``16*b*s*h^2`` (4h wide), attention ``4*b*s^2*h + 8*b*s*h^2`` (twice for
  the decoder's self- and cross-attention), backward = 2x forward.
* ``copy`` (``membw``): ``dst.copy_(src)`` of ``size_bytes``: bytes read plus
  bytes written = ``2*size_bytes`` per copy.

Rank side: :class:`perfsuite.rank.worker.microbench.MicrobenchRunner`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from perfsuite.core.protocol import WorkloadSpec
from perfsuite.core.validation import check_choice, check_int, fail
from perfsuite.core.workloads.base import BaseScenario

Op = Literal["matmul", "matmul_best", "vector_mul", "layer"]
OPS: tuple[str, ...] = get_args(Op)
Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
DTYPES: tuple[str, ...] = get_args(Dtype)
Layer = Literal["bert", "gpt2", "t5_encoder", "t5_decoder"]
LAYERS: tuple[str, ...] = get_args(Layer)
Pass = Literal["fwd", "fwd_bwd"]
PASSES: tuple[str, ...] = get_args(Pass)

MATMUL_FORMULA = "2*m*n*k per matmul (a multiply-add counts as 2 FLOPs)"
VECTOR_FORMULA = "n per elementwise multiply of n elements"
LAYER_FORMULA = (
    "forward: 4*b*s*h*ffn (FFN) + (4*b*s^2*h + 8*b*s*h^2) per attention block (2 in the T5 decoder: "
    "self + cross); forward+backward: 3 x forward (mli/transformers-benchmarks' counting)"
)
COPY_FORMULA = "2*size_bytes per copy (bytes read + bytes written), 1 GB = 1e9 bytes"


def matmul_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def layer_flops(layer: str, layer_pass: str, batch: int, seq: int, hidden: int, ffn: int) -> float:
    """FLOPs of one block's forward (or forward+backward), by :data:`LAYER_FORMULA`."""
    b, s, h = batch, seq, hidden
    attention = 4.0 * b * s * s * h + 8.0 * b * s * h * h
    forward = 4.0 * b * s * h * ffn + (2 if layer == "t5_decoder" else 1) * attention
    return forward * (3 if layer_pass == "fwd_bwd" else 1)


@dataclass(frozen=True)
class MicrobenchSpec(WorkloadSpec):
    """What a rank needs to time one compute microbenchmark."""

    runner: ClassVar[str] = "perfsuite.rank.worker.microbench:MicrobenchRunner"

    op: Op
    """matmul, matmul_best, vector_mul or layer."""
    dtype: Dtype
    """Element type (and math mode for tf32/fp8)."""
    shape: tuple[int, ...]
    """matmul: (m, n, k); vector_mul: (n,); layer: (batch, seq, hidden, heads, ffn)."""
    iterations: int
    """Calls per timed step."""
    layer: str
    """The block for ``layer`` (one of :data:`LAYERS`), else empty."""
    layer_pass: Pass
    """fwd or fwd_bwd, for ``layer``."""
    search: tuple[tuple[int, int, int], ...]
    """(m, n, k) shapes a ``matmul_best`` rank times to pick the fastest."""


@dataclass(frozen=True)
class Microbench(BaseScenario):
    """A compute ceiling: TFLOP/s of one kernel or block on one device."""

    kind: ClassVar[str] = "microbench"
    metrics: ClassVar[tuple[str, ...]] = ("tflops", "peak_mem_mib")
    primary: ClassVar[str] = "tflops"

    op: Op = "matmul"
    """matmul, matmul_best (best-shape search), vector_mul or layer."""
    dtype: Dtype = "bf16"
    """fp32, tf32, fp16, bf16 or fp8."""
    shape: tuple[int, ...] = (4096, 4096, 4096)
    """matmul: (m, n, k); vector_mul: (n,); layer: (batch, seq, hidden, heads, ffn).
    Ignored by matmul_best, which measures the shape its search picks."""
    iterations: int = 10
    """Calls per timed step: enough that a step is far longer than the clock's resolution."""
    layer: str = ""
    """For op="layer": bert, gpt2, t5_encoder or t5_decoder."""
    layer_pass: Pass = "fwd"
    """For op="layer": fwd (forward only) or fwd_bwd."""
    search: tuple[tuple[int, int, int], ...] = ()
    """For op="matmul_best": the (m, n, k) shapes to search."""

    def validate(self) -> None:
        super().validate()
        owner = self.id
        check_choice(owner, "op", self.op, OPS)
        check_choice(owner, "dtype", self.dtype, DTYPES)
        check_int(owner, "iterations", self.iterations, 1)
        if self.world_size != 1:
            raise fail(owner, "world_size", f"must be 1: a microbenchmark measures one device, got {self.world_size}")
        arity = {"matmul": 3, "matmul_best": 3, "vector_mul": 1, "layer": 5}[self.op]
        if not isinstance(self.shape, tuple) or len(self.shape) != arity:
            raise fail(owner, "shape", f"must be a tuple of {arity} ints for op {self.op!r}, got {self.shape!r}")
        for size in self.shape:
            check_int(owner, "shape", size, 1)
        if self.op == "layer":
            self._validate_layer(owner)
        elif self.layer:
            raise fail(owner, "layer", f"only applies to op 'layer', not {self.op!r}")
        if self.op == "matmul_best":
            search = self.search if isinstance(self.search, tuple) else ()
            if not search or not all(isinstance(s, tuple) and len(s) == 3 for s in search):
                raise fail(owner, "search", "must list (m, n, k) shapes for op 'matmul_best'")
            for shape in self.search:
                for size in shape:
                    check_int(owner, "search", size, 1)
        elif self.search != ():
            raise fail(owner, "search", f"only applies to op 'matmul_best', not {self.op!r}, got {self.search!r}")
        if self.dtype in ("tf32", "fp8") and self.op not in ("matmul", "matmul_best"):
            raise fail(owner, "dtype", f"{self.dtype!r} is a matmul mode; op {self.op!r} takes fp32, fp16 or bf16")

    def _validate_layer(self, owner: str) -> None:
        check_choice(owner, "layer", self.layer, LAYERS)
        check_choice(owner, "layer_pass", self.layer_pass, PASSES)
        _, _, hidden, heads, _ = self.shape
        if hidden % heads:
            raise fail(owner, "shape", f"heads={heads} must divide hidden={hidden}")

    def picks(self) -> Mapping[str, tuple[str, ...]]:
        # The search keeps the fastest shape: its TFLOP/s is the ceiling whatever the shape,
        # but its peak memory is that shape's (352 or 608 MiB for tf32 on one H100).
        return {"best_shape": ("peak_mem_mib",)} if self.op == "matmul_best" else {}

    def precondition(self, device: str) -> str | None:
        if device == "cpu" and self.dtype == "tf32":
            return "tf32 is a CUDA tensor-core math mode; there is no cpu equivalent"
        if device == "cpu" and self.dtype == "fp8":
            return "fp8 matmuls need a GPU of compute capability 8.9 or newer"
        return None

    @property
    def flops_formula(self) -> str:
        return {"layer": LAYER_FORMULA, "vector_mul": VECTOR_FORMULA}.get(self.op, MATMUL_FORMULA)

    def step_work(self) -> Mapping[str, float]:
        # matmul_best reports its own work (the shape is chosen on the rank).
        if self.op in ("matmul", "matmul_best"):
            flops = matmul_flops(*self.shape[:3])
        elif self.op == "vector_mul":
            flops = float(self.shape[0])
        else:
            batch, seq, hidden, _, ffn = self.shape
            flops = layer_flops(self.layer, self.layer_pass, batch, seq, hidden, ffn)
        return {"tflops": flops * self.iterations / 1e12}

    def rank_spec(self) -> MicrobenchSpec:
        return MicrobenchSpec(
            **self.spec_fields(),
            op=self.op,
            dtype=self.dtype,
            shape=self.shape,
            iterations=self.iterations,
            layer=self.layer,
            layer_pass=self.layer_pass,
            search=self.search,
        )

    def to_config(self) -> dict[str, Any]:
        config = {**super().to_config(), "op": self.op, "dtype": self.dtype, "shape": list(self.shape)}
        config.update(iterations=self.iterations, flops_formula=self.flops_formula)
        if self.op == "layer":
            config.update(layer=self.layer, layer_pass=self.layer_pass)
        if self.op == "matmul_best":
            config["search"] = [list(s) for s in self.search]
        return config


@dataclass(frozen=True)
class CopySpec(WorkloadSpec):
    """What a rank needs to time device-to-device copies."""

    runner: ClassVar[str] = "perfsuite.rank.worker.microbench:CopyRunner"

    size_bytes: int
    """Bytes per copy."""
    iterations: int
    """Copies per timed step."""


@dataclass(frozen=True)
class DeviceCopy(BaseScenario):
    """Device memory bandwidth: a copy of ``size_bytes`` within one device."""

    kind: ClassVar[str] = "membw"
    metrics: ClassVar[tuple[str, ...]] = ("mem_gbps", "peak_mem_mib")
    primary: ClassVar[str] = "mem_gbps"

    size_bytes: int = 2**30
    """Bytes per copy (at least 1 GiB on GPUs, so caches do not flatter the figure)."""
    iterations: int = 10
    """Copies per timed step."""

    def validate(self) -> None:
        super().validate()
        check_int(self.id, "size_bytes", self.size_bytes, 4)
        check_int(self.id, "iterations", self.iterations, 1)
        if self.world_size != 1:
            raise fail(self.id, "world_size", f"must be 1: bandwidth is measured on one device, got {self.world_size}")
        if self.size_bytes % 4:
            raise fail(self.id, "size_bytes", "must be a multiple of 4 (fp32 elements)")

    def step_work(self) -> Mapping[str, float]:
        return {"mem_gbps": 2 * self.size_bytes * self.iterations / 1e9}

    def rank_spec(self) -> CopySpec:
        return CopySpec(
            **self.spec_fields(),
            size_bytes=self.size_bytes,
            iterations=self.iterations,
        )

    def to_config(self) -> dict[str, Any]:
        return {
            **super().to_config(),
            "size_bytes": self.size_bytes,
            "iterations": self.iterations,
            "bytes_formula": COPY_FORMULA,
        }


__all__ = ["CopySpec", "DeviceCopy", "Microbench", "MicrobenchSpec", "layer_flops", "matmul_flops"]
