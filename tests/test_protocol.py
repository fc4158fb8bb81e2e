"""The rank protocol: typed job and report, strict both ways, so the pytest side
and the ranks cannot drift apart silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsuite import ModelSpec, Scenario
from perfsuite.core.protocol import ProtocolError, RankJob, RankReport
from perfsuite.core.workloads.train import TrainSpec
from perfsuite.launch.base import WorkerJob, read_reports

GPT = ModelSpec("megatron_gpt", layers=4, hidden=64, heads=4, vocab=512, max_positions=64, dropout=0)
SCENARIO = Scenario(
    "g",
    "s",
    GPT,
    precision="bf16",
    strategy="tp_pp",
    strategy_options={"pp": 2, "schedule": "gpipe", "microbatches": 2},
    world_size=4,
    micro_batch=1,
    global_batch=4,
    seq_len=32,
)


def job(tmp_path: Path) -> RankJob:
    return RankJob(spec=SCENARIO.rank_spec(), device="cpu", reports_dir=str(tmp_path), rank_memory_budget_mib=256)


def test_job_round_trips_through_json_with_its_kind(tmp_path: Path) -> None:
    original = job(tmp_path)
    original.write(tmp_path / "job.json")
    doc = json.loads((tmp_path / "job.json").read_text())
    assert doc["spec_type"] == "perfsuite.core.workloads.train:TrainSpec"
    back = RankJob.read(tmp_path / "job.json")
    assert back == original and isinstance(back.spec, TrainSpec)
    assert back.spec.layout.dp == 2 and back.spec.model == GPT and back.spec.grad_accum == 2


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["spec"].update(micro_batches=3), r"RankJob.spec: unknown field\(s\) \['micro_batches'\]"),
        (lambda d: d["spec"].pop("seq_len"), "RankJob.spec: missing field 'seq_len'"),
        (lambda d: d["spec"]["model"].update(layers="4"), "RankJob.spec.model.layers: expected int"),
        (lambda d: d.update(device="tpu"), "RankJob.device: must be one of"),
        (lambda d: d.update(spec_type="nowhere:Spec"), "spec_type cannot be resolved"),
    ],
)
def test_a_drifted_job_names_the_field(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = job(tmp_path).to_json()
    mutate(doc)
    with pytest.raises(ProtocolError, match=message):
        RankJob.from_json(doc)


def test_report_round_trip_keeps_exact_counts_as_ints() -> None:
    report = RankReport(
        rank=1,
        status="ok",
        step_times_s=(0.5, 0.25),
        metrics={"model_state_bytes_per_rank": 7186832},
        model_state={"params": 1, "total": 1},
    )
    back = RankReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back == report and isinstance(back.metrics["model_state_bytes_per_rank"], int)


def test_a_report_from_a_drifted_rank_fails_loudly_naming_the_file(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "rank0.json").write_text(json.dumps({"rank": 0, "status": "ok", "samples": [1.0]}))
    worker_job = WorkerJob(job(tmp_path), world_size=1, timeout_s=1, workdir=tmp_path)
    with pytest.raises(ProtocolError, match=r"rank0.json: RankReport: unknown field\(s\) \['samples'\]"):
        read_reports(worker_job)


def test_a_cuda_ranks_memory_detail_with_its_nvml_scope_reads_back(tmp_path: Path) -> None:
    # What CudaMemoryTracker reports on a GPU: allocator peaks plus which NVML
    # figure it read (a string), or why it has none. The first GPU run (H200,
    # 2026-11-26) failed every launch here: the field was typed numbers-only.
    memory = {
        "max_allocated_mib": 812.5,
        "max_reserved_mib": 900.0,
        "nvml_peak_mib": 1024.0,
        "nvml_scope": "device",
        "nvml_error": "process list failed: NVMLError: Not Supported",
    }
    RankReport(rank=0, status="ok", step_times_s=(0.1,), memory=memory).write(tmp_path / "reports" / "rank0.json")
    wj = WorkerJob(job(tmp_path), 1, 10.0, tmp_path)
    (report,) = read_reports(wj).values()
    assert report.memory == memory
