"""The train kind's ``graph`` field (group graph_optimization): validated at
declaration, compile time reported apart from the measured steps, and ORT
rows that skip naming ``make env-ort`` where ORTModule cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import CPU_PROFILE

from perfsuite import ModelSpec, Scenario, ScenarioError
from perfsuite.rank.worker import graph
from perfsuite.rank.worker.graph import CompileWatch

TINY = ModelSpec("bert_cls", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"graph": "jit"}, "field 'graph' must be one of"),
        ({"graph": "compile", "strategy": "fairscale_oss"}, "'compile' does not compose with strategy 'fairscale_oss'"),
        (
            {"graph": "ort", "strategy": "torch_zero"},
            "'ort' does not compose with strategy 'torch_zero'.*take it: ddp$",
        ),
    ],
)
def test_the_graph_field_is_validated_at_declaration(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Scenario("g", "s", TINY, world_size=2, micro_batch=2, global_batch=4, seq_len=32, **fields)  # type: ignore[arg-type]


def test_a_graph_row_declares_its_mode_in_config() -> None:
    scenario = Scenario("g", "s", TINY, graph="compile", world_size=2, micro_batch=2, global_batch=4, seq_len=32)
    assert scenario.to_config()["graph"] == "compile" and scenario.rank_spec().graph == "compile"


def _steps(watch: CompileWatch, fn: object, inputs: list[torch.Tensor]) -> None:
    for x in inputs:
        with watch:
            fn(x)  # type: ignore[operator]


def test_compile_time_is_reported_apart_from_the_measured_steps() -> None:
    # dynamo with the eager backend: a real compile (and recompile) in
    # milliseconds, where inductor would take seconds.
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend="eager")
    watch = CompileWatch("compile")
    _steps(watch, fn, [torch.ones(4)] * 5)
    assert watch.compiled_in == [0]
    detail = watch.detail(warmup_times_s=[4.5, 1.1, 1.0], step_times_s=[1.0, 1.2, 0.9])
    assert detail == {"graph": "compile", "compile_s": 3.5, "compile_steps": [0]}


def test_a_compile_during_a_measured_step_fails_the_run() -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend="eager")
    watch = CompileWatch("compile")
    _steps(watch, fn, [torch.ones(4)] * 3 + [torch.ones(2, 3)])  # a new shape recompiles in step 3
    assert watch.compiled_in == [0, 3]
    with pytest.raises(RuntimeError, match=r"measured step\(s\) \[1\].*raise the scenario's warmup_steps above 3"):
        watch.detail(warmup_times_s=[4.0, 1.0], step_times_s=[1.0, 2.0])


def test_a_compile_row_that_compiled_nothing_fails_the_run() -> None:
    """torch.compile that ran every frame eagerly would measure eager training as the compiled row."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    watch = CompileWatch("compile")
    _steps(watch, torch.tanh, [torch.ones(2)] * 3)  # never compiled
    with pytest.raises(RuntimeError, match=r"compiled no graph in 2 warmup step\(s\).*measure eager training"):
        watch.detail(warmup_times_s=[1.0, 1.0], step_times_s=[1.0])
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend="eager")
    fn(torch.ones(2))  # compiled before the watched steps (a dry run): the rank compiled, all is well
    assert watch.detail(warmup_times_s=[1.0, 1.0], step_times_s=[1.0])["compile_steps"] == []


def test_eager_reports_nothing_and_ort_counts_its_export_step() -> None:
    eager, ort = CompileWatch("eager"), CompileWatch("ort")
    for watch in (eager, ort):
        _steps(watch, torch.tanh, [torch.ones(2)] * 3)
    assert eager.detail([1.0], [1.0]) == {} and ort.compiled_in == [0]
    assert ort.detail([2.0, 1.0], [1.0, 1.0])["compile_s"] == 1.0


ORT_MODULE = textwrap.dedent(
    """
    from perfsuite import ModelSpec, Scenario, parametrize

    TINY = ModelSpec("bert_cls", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)

    @parametrize([Scenario("g", "ort", TINY, graph="ort", env="ort", world_size=2, micro_batch=2,
                           global_batch=4, seq_len=32, warmup_steps=1, steps=2)])
    def test_bench(perf, scenario):
        perf.check(scenario)
    """
)


def test_an_ort_row_skips_naming_make_env_ort_where_ortmodule_cannot_run(pytester: pytest.Pytester) -> None:
    # This interpreter (newer torch, no onnxruntime-training) as the "ort"
    # environment: the ranks start, find no usable ORTModule and say how to build one.
    pytester.makepyfile(test_bench=ORT_MODULE)
    result = pytester.runpytest_subprocess(CPU_PROFILE, f"--perf-env=ort={sys.executable}", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*g.ort*ORTModule cannot be used with torch*`make env-ort`*--perf-env ort=*"])


# A rank's real main(), stopped where it reads its job: by then a model's build
# would import transformers, whose modules import torch._dynamo, which sets
# TORCHINDUCTOR_CACHE_DIR to torch's /tmp default unless it is already set.
_RANK_START = """
import sys
from perfsuite.rank.worker import __main__ as rank

class StopAtTheJob:
    @staticmethod
    def read(path):
        import transformers.models.bert.modeling_bert
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        print("torch._dynamo" in sys.modules, cache_dir())
        raise SystemExit(0)

rank.RankJob = StopAtTheJob
rank.main(["job.json"])
"""


def test_a_rank_keeps_compiled_kernels_in_the_checkout() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", _RANK_START], env=env, capture_output=True, text=True, check=True)
    dynamo_imported, where = out.stdout.split()
    checkout = Path(graph.__file__).resolve().parents[3]
    assert dynamo_imported == "True", "transformers no longer imports torch._dynamo: this test checks nothing"
    assert Path(where) == checkout / "build" / "inductor-cache"


def test_a_cache_folder_the_user_chose_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    graph.pin_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)


def test_a_kernel_left_empty_by_a_killed_compile_is_swept_but_one_being_linked_is_not(tmp_path: Path) -> None:
    dead, linking, good = (tmp_path / "ay" / f"{n}.main.so" for n in ("dead", "linking", "good"))
    dead.parent.mkdir()
    for path in (dead, linking):
        path.touch()
    good.write_bytes(b"\x7fELF")
    old = time.time() - 3600
    os.utime(dead, (old, old))
    os.utime(good, (old, old))
    assert graph.sweep_dead_kernels(tmp_path) == [dead]
    assert not dead.exists() and linking.exists() and good.exists()
