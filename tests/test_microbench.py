"""The microbench and membw kinds: FLOP counting, validation, agreement with a
plain timed torch.matmul loop, the best-shape search and same-session ceilings."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import CPU_PROFILE

from perfsuite import DeviceCopy, Microbench, ScenarioError
from perfsuite.core.workloads.microbench import layer_flops, matmul_flops


def test_layer_flops_follow_the_seed_sources_counting() -> None:
    b, s, h = 128, 128, 1024  # BERT-large layer at the seed's best row
    ffn, attention = 16 * b * s * h * h, 4 * b * h * s * s + 8 * b * s * h * h
    assert layer_flops("bert", "fwd", b, s, h, 4 * h) == ffn + attention
    assert layer_flops("bert", "fwd_bwd", b, s, h, 4 * h) == 3 * (ffn + attention)
    assert layer_flops("t5_decoder", "fwd", b, s, h, 4 * h) == ffn + 2 * attention  # self + cross
    assert matmul_flops(8192, 8192, 8192) == 2 * 8192**3


def test_work_per_step_and_config_name_the_formula() -> None:
    scenario = Microbench("m", "mm", op="matmul", dtype="bf16", shape=(64, 32, 16), iterations=5)
    assert scenario.step_work() == {"tflops": 5 * 2 * 64 * 32 * 16 / 1e12}
    assert "2*m*n*k" in scenario.to_config()["flops_formula"]
    copy = DeviceCopy("m", "copy", size_bytes=2**30, iterations=3)
    assert copy.step_work() == {"mem_gbps": 3 * 2 * 2**30 / 1e9}  # read + written
    assert "bytes read + bytes written" in copy.to_config()["bytes_formula"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"op": "fft"}, "op"),
        ({"op": "matmul", "shape": (8, 8)}, "shape"),
        ({"op": "matmul", "world_size": 2}, "world_size"),
        ({"op": "vector_mul", "shape": (8,), "dtype": "tf32"}, "dtype"),
        ({"op": "matmul", "search": ((8, 8, 8),)}, "search"),
        ({"op": "matmul_best"}, "search"),
        ({"op": "layer", "shape": (2, 8, 64, 4, 256), "layer": "lstm"}, "layer"),
        ({"op": "layer", "shape": (2, 8, 64, 5, 256), "layer": "bert"}, "shape"),  # heads do not divide hidden
    ],
)
def test_bad_microbench_names_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError, match=f"field '{field}'"):
        Microbench("m", "x", **fields)  # type: ignore[arg-type]


def test_gpu_only_math_modes_skip_on_cpu_saying_why() -> None:
    assert "CUDA tensor-core math mode" in Microbench("m", "a", dtype="tf32").precondition("cpu")
    assert "compute capability 8.9" in Microbench("m", "b", dtype="fp8").precondition("cpu")
    assert Microbench("m", "c", dtype="fp8").precondition("cuda") is None  # decided on the rank, by the GPU


N, ITERATIONS = 512, 20  # ~30 ms a step: long enough that a scheduler hiccup is not the figure
PLAIN_LOOP = textwrap.dedent(
    f"""
    import statistics, time, torch
    n, iterations = {N}, {ITERATIONS}
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    deadline = time.perf_counter() + 1.0  # a second of warm-up: clocks and caches settle
    while time.perf_counter() < deadline:
        torch.matmul(a, b, out=out)
    rates = []
    for _ in range(10):
        start = time.perf_counter()
        for _ in range(iterations):
            torch.matmul(a, b, out=out)
        rates.append(2 * n**3 * iterations / (time.perf_counter() - start) / 1e12)
    print(statistics.fmean(rates))
    """
)
MODULE = textwrap.dedent(
    f"""
    from perfsuite import Microbench, parametrize

    SCENARIOS = [
        Microbench("mb", "matmul_fp32", op="matmul", dtype="fp32", shape=({N}, {N}, {N}),
                   iterations={ITERATIONS}, warmup_steps=3, steps=10),
        Microbench("mb", "best_fp32", op="matmul_best", dtype="fp32", search=((64, 64, 64), ({N}, {N}, {N})),
                   iterations={ITERATIONS}, warmup_steps=1, steps=3),
    ]

    @parametrize(SCENARIOS)
    def test_bench(perf, scenario):
        perf.check(scenario)
    """
)


#: Rounds of (plain, plain, perfsuite, plain); a round whose plain runs spread wider than
#: this (max / min) measured the machine's noise, not perfsuite's bias.
ROUNDS, QUIET_SPREAD = 3, 1.25


def plain_matmul_tflops() -> float:
    out = subprocess.run([sys.executable, "-c", PLAIN_LOOP], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


@pytest.mark.serial  # a 10% timing comparison: nothing else may run beside it
def test_microbench_matmul_agrees_with_a_plain_matmul_loop_and_the_search_keeps_its_table(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(test_bench=MODULE)
    out = project.path / "r.json"
    # The same shape timed by a plain loop twice before and once after:
    # perfsuite's figure is within 10% of a plain run of those same minutes.
    # Not of their median: the plain runs alone spread by up to 20% on this
    # machine (CI measured 0.152, 0.164 before and 0.183 after a 0.181 run).
    # A second round where the first disagrees: the VM once ran a whole
    # launch at half speed (0.102 against 0.20, 0.197 and 0.182, with no
    # process of its own busy), and a real bias in perfsuite fails both rounds.
    rounds, results, noisy = [], {}, ""
    for _ in range(ROUNDS):
        plain_runs = [plain_matmul_tflops(), plain_matmul_tflops()]
        result = project.runpytest_subprocess(CPU_PROFILE, f"--perf-json={out}", "-p", "no:cacheprovider", "-v")
        plain_runs.append(plain_matmul_tflops())
        result.assert_outcomes(skipped=2)  # no baselines: measured, then no_baseline
        results = {r["id"]: r for r in json.loads(out.read_text())["results"]}
        measured = results["mb.matmul_fp32"]["metrics"]["tflops"]["mean"]
        rounds.append((measured, plain_runs))
        if min(abs(measured / plain - 1) for plain in plain_runs) <= 0.10:
            break
    else:
        quiet = [r for r in rounds if max(r[1]) / min(r[1]) <= QUIET_SPREAD]
        if not quiet:
            # The machine itself disagreed: CI once timed the plain loop at 0.048, 0.090, 0.050
            # and then 0.033, 0.042, 0.140 TFLOP/s. A 10% agreement cannot be judged there.
            noisy = f"the plain loop alone varied more than {QUIET_SPREAD - 1:.0%} in every round: {rounds}"
        else:
            pytest.fail(f"perfsuite's matmul TFLOP/s vs the plain loop's, per round: {rounds}")

    best = results["mb.best_fp32"]["metrics"]
    table = best["detail"]["search"]
    assert [row["shape"] for row in table] == [[64, 64, 64], [N, N, N]]
    assert best["detail"]["best_shape"] == max(table, key=lambda row: row["tflops"])["shape"]
    if noisy:
        pytest.skip(noisy)
