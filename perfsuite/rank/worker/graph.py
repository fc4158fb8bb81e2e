"""Rank side of a train scenario's ``graph`` field: the model runs eagerly,
compiled by torch.compile (inductor), or through onnxruntime-training's ORTModule.

Each wraps where its own documentation puts it. ORTModule goes inside the
engine's wrapper (ORT's recipe is ``DDP(ORTModule(model))``: ORT trains the
module, DDP reduces its gradients). torch.compile is the strategy's: outside DDP, as
accelerate does (dynamo's DDP optimizer then splits the graph at DDP's bucket
boundaries, so gradient all-reduce still overlaps the backward pass), per block under
FSDP2 and tp_pp, and DeepSpeed's own ``engine.compile()``.

The compile (or ONNX export) happens during the first step and any recompile
during a later one; :class:`CompileWatch` notes which steps compiled, so the
runner reports their extra time separately (``detail.compile_s``) and refuses a
run that compiled during a measured step.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perfsuite.core.files import user_cache
from perfsuite.core.protocol import EngineUnavailable
from perfsuite.rank.strategies.base import Strategy

ORT_ENV_COMMAND = "make env-ort"
ORT_MODULE = "onnxruntime.training.ortmodule"


def check(mode: str, device: torch.device) -> None:
    """Raise EngineUnavailable, naming what to install, if ``mode`` cannot run here."""
    if mode == "ort":
        _import_ort_module()
    elif mode == "compile" and device.type == "cpu" and not (os.environ.get("CXX") or shutil.which("g++")):
        raise EngineUnavailable("torch.compile on cpu needs a C++ compiler (inductor): apt-get install g++")


def setup(strategy: Strategy, model: nn.Module, mode: str, device: torch.device) -> None:
    """``strategy.setup(model)`` with the graph optimization ``mode`` applied: ORTModule
    here, torch.compile by the strategy itself (``StrategyContext.graph``), where its engine
    documents it: per block for FSDP2 and tp_pp, ``engine.compile()`` for DeepSpeed."""
    if mode == "ort":
        if device.type == "cpu":
            # ORT's thread pool and torch's compete for the cores otherwise (1.3-3.3x slower).
            torch.set_num_threads(1)
        model = _import_ort_module()(model)
    strategy.setup(model)


def _import_ort_module() -> Any:
    try:
        return importlib.import_module(ORT_MODULE).ORTModule
    except Exception as exc:  # an ImportError, or ORT's own failure against this torch
        raise EngineUnavailable(
            f"ORTModule cannot be used with torch {torch.__version__} here ({type(exc).__name__}: "
            f"{str(exc)[:200]}); build its environment with `{ORT_ENV_COMMAND}` and pass "
            "--perf-env ort=.venv-ort/bin/python"
        ) from None


def pin_inductor_cache() -> None:
    """Keep inductor's compiled kernels where the next run finds them (a warm
    cache made the cpu graph rows' compile 5-6 s instead of 33-46 s), unless the user chose a place.

    Called first thing in a rank: importing torch._dynamo (transformers' model
    modules do, so does the Trainer) makes torch set TORCHINDUCTOR_CACHE_DIR to
    its /tmp default, which would then look like the user's choice."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    checkout = Path(__file__).resolve().parents[3]
    in_checkout = (checkout / "pyproject.toml").is_file()  # a source checkout: its ignored build/
    where = checkout / "build" / "inductor-cache" if in_checkout else user_cache("inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(where)
    sweep_dead_kernels(where)


#: An empty compiled kernel older than this is a dead build, not one being linked.
DEAD_KERNEL_AGE_S = 60.0


def sweep_dead_kernels(cache: Path, min_age_s: float = DEAD_KERNEL_AGE_S) -> list[Path]:
    """Delete empty kernel libraries that a stopped run left in ``cache``; return them.

    A compile killed while g++ links (a run stopped at its time limit, Ctrl-C,
    a cancelled CI job) leaves a zero-byte ``.so`` under its final name, and
    inductor then fails every later run on it ("file too short"): seen
    after a bootstrap stopped a compile row at its budget's end. Only
    empty files older than ``min_age_s`` go, so a kernel that another rank is
    linking right now is left alone."""
    now = time.time()
    removed = []
    for path in cache.rglob("*.so") if cache.is_dir() else ():
        with contextlib.suppress(OSError):  # another rank swept it first
            info = path.stat()
            if info.st_size == 0 and now - info.st_mtime > min_age_s:
                path.unlink()
                removed.append(path)
    return removed


class CompileWatch:
    """Which steps compiled a graph: torch.compile's count of compiled frames
    grows when one does; ORTModule exports and builds its session in step 0."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.compiled_in: list[int] = []
        self._step = 0
        self._before = 0

    def __enter__(self) -> CompileWatch:
        self._before = _compiled_frames() if self.mode == "compile" else 0
        return self

    def __exit__(self, *exc: object) -> None:
        compiled = _compiled_frames() > self._before if self.mode == "compile" else self._step == 0
        if compiled and self.mode != "eager":
            self.compiled_in.append(self._step)
        self._step += 1

    def detail(self, warmup_times_s: Sequence[float], step_times_s: Sequence[float]) -> dict[str, Any]:
        """The compile time for the results file: each compiling step's time
        beyond a steady (median measured) step. Raises if a measured step compiled, or if a
        compile row's rank compiled nothing at all."""
        if self.mode == "eager":
            return {}
        if self.mode == "compile" and not _compiled_frames():
            # Measured, such a row would be eager training under a compiled row's name (dynamo gave
            # up on every frame it saw, or torch.compile's first call ran where nothing compiles).
            raise RuntimeError(
                f"graph='compile' compiled no graph in {len(warmup_times_s)} warmup step(s): torch.compile "
                "ran every frame eagerly, so the row would measure eager training; run one step with "
                "TORCH_LOGS=graph_breaks to see why"
            )
        warmup = len(warmup_times_s)
        late = [i for i in self.compiled_in if i >= warmup]
        if late:
            raise RuntimeError(
                f"graph={self.mode!r} compiled again in measured step(s) {[i - warmup for i in late]}: "
                f"its time would count as training; raise the scenario's warmup_steps above {late[-1]}"
            )
        steady = statistics.median(step_times_s)
        extra = sum(max(0.0, warmup_times_s[i] - steady) for i in self.compiled_in)
        return {"graph": self.mode, "compile_s": round(extra, 3), "compile_steps": list(self.compiled_in)}


def _compiled_frames() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


__all__ = ["CompileWatch", "check", "pin_inductor_cache", "setup"]
