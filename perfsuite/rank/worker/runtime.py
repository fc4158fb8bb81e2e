"""Per-rank runtime: process group, device, memory limits and the phase/report files."""

from __future__ import annotations

import dataclasses
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from perfsuite.core.protocol import LaunchMark, RankJob, RankReport
from perfsuite.rank.worker.marks import Marks, mark


@dataclass(frozen=True)
class WorkerContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @classmethod
    def from_env(cls, device_kind: str) -> WorkerContext:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        if device_kind == "cuda":
            if getattr(torch.cuda, "_is_in_bad_fork", lambda: False)():
                raise RuntimeError(
                    "this rank was forked from a torchrun agent that had initialised CUDA, and cannot use it: "
                    "start ranks as fresh interpreters (rank_start='exec', --perf-rank-start=exec)"
                )
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            backend = "gloo"
        return cls(rank, local_rank, int(os.environ["WORLD_SIZE"]), device, backend)

    def init_process_group(self) -> None:
        kwargs: dict[str, Any] = {"backend": self.backend}
        if self.device.type == "cuda":
            kwargs["device_id"] = self.device  # binds NCCL eagerly to this GPU
        dist.init_process_group(**kwargs)

    def apply_limits(self, job: RankJob) -> None:
        """The profile's memory limits. They go on after imports and
        process-group setup, so the budget covers what the workload allocates
        rather than the libraries."""
        if job.rank_memory_budget_mib and self.device.type == "cpu":
            apply_cpu_memory_budget(job.rank_memory_budget_mib)
        if job.device_memory_cap_mib and self.device.type == "cuda":
            apply_cuda_memory_cap(self.device, job.device_memory_cap_mib)

    def open_device(self) -> None:
        """Create this rank's CUDA context now (a tiny op, synchronised; cuda only), so the
        launch's timeline shows what it costs apart from the process group's setup."""
        torch.ones(1, device=self.device).add_(1)
        torch.cuda.synchronize(self.device)

    def synchronize(self) -> None:
        """Wait for queued device work, so host clocks measure finished steps."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def physical_gpu_index(logical: int) -> int:
    """NVML index of CUDA device ``logical`` under an index-list CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p for p in visible.split(",") if p.strip().isdigit()]
    return int(parts[logical]) if logical < len(parts) else logical


def vm_data_bytes() -> int:
    """The process's data segment (VmData), the quantity RLIMIT_DATA bounds."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmData not found in /proc/self/status")


def apply_cpu_memory_budget(budget_mib: int) -> None:
    """Cap this rank's data segment at its current size plus ``budget_mib``.

    Only the soft limit is set, so the worker can lift it again to write its
    report after an allocation failure.
    """
    limit = vm_data_bytes() + budget_mib * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def lift_cpu_memory_budget() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def apply_cuda_memory_cap(device: torch.device, cap_mib: int) -> None:
    """Emulate a smaller card: the caching allocator refuses beyond ``cap_mib``."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_mib * 2**20 / total), device)


def runtime_fingerprint() -> dict[str, Any]:
    """What only a live torch knows: its CUDA/NCCL/cuDNN builds, and the instruction set its
    CPU kernels dispatch to on this node (``AVX2``, ``AVX512``, ...: ATen's own choice)."""
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["cudnn"] = torch.backends.cudnn.version()
    return info


class Reporter:
    """Writes this rank's progress (``rankN.phase``) and final report (``rankN.json``),
    and keeps the marks of the launch's timeline it passed, which the report carries."""

    def __init__(self, folder: Path, rank: int, marks: Marks | None = None) -> None:
        self.folder, self.rank = folder, rank
        self.marks: Marks = dict(marks or {})
        folder.mkdir(parents=True, exist_ok=True)

    def mark(self, name: LaunchMark) -> None:
        """This rank has reached ``name`` (:data:`~perfsuite.core.protocol.LAUNCH_MARKS`)."""
        mark(self.marks, name)

    def phase(self, text: str) -> None:
        # Replaced whole, never truncated in place: the progress line polls
        # these files and would otherwise read an empty phase mid-write. Not
        # files.atomic_write_text: its fsync on every step is not wanted here.
        tmp = self.folder / f".rank{self.rank}.phase.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.folder / f"rank{self.rank}.phase")

    def write(self, report: RankReport) -> None:
        """Write ``report`` with the marks passed, ``report`` (now) the last."""
        self.mark("report")
        dataclasses.replace(report, marks=self.marks).write(self.folder / f"rank{self.rank}.json")
