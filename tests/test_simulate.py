"""``selftest --simulate``: the vectorised model is the gate's own judging code and the sequential
A/B's own ``run_ab``, its inputs are the committed data, and what it prints (rates with intervals,
the A/B's figures, the model's verdict on the committed trials, each row's smallest detectable
slowdown) behaves. Seconds, no launch."""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfsuite.__main__ import main
from perfsuite.core.profiles import CPU, HardwareProfile, gpu_profile
from perfsuite.judge import sequential
from perfsuite.judge.sequential import Design
from perfsuite.judge.simulate import ab_minimum_detectable, minimum_detectable, model, realgate, sensitivity
from perfsuite.judge.simulate.cli import Options, report
from perfsuite.judge.simulate.noise import PROFILES, Row, min_effect_of, noise_of, typical_row
from perfsuite.judge.simulate.rates import rate
from perfsuite.judge.simulate.trials import COMMITTED, Trials
from perfsuite.store.baselines import BaselineEntry

ROOT = Path(__file__).resolve().parents[1]
H100 = gpu_profile("nvidia-h100-80gb-hbm3-x1")
INTERVAL = r"\d[\d.]*% \(\d[\d.]*%-\d[\d.]*%\)"


@pytest.mark.parametrize("profile", [CPU, H100], ids=["cpu", "h100"])
@pytest.mark.parametrize("slowdown", [0.0, 0.05, 0.10])
def test_the_vectorised_gate_is_the_gates_own_judging_code(profile: HardwareProfile, slowdown: float) -> None:
    noise = noise_of(profile.name)
    # Twice the tolerance's worth of session spread: failures at every level, not only at the extremes.
    row = Row(
        noise.step_cv.value,
        noise.launch_cv.value,
        0.5 * typical_row(noise, profile).tolerance,
        noise.steps,
        noise.baseline_launches,
        typical_row(noise, profile).tolerance,
    )
    rules = model.Rules.of(profile)
    draws = model.gate_draws(row, rules, np.random.default_rng(7), 40_000)
    modelled = model.gate_verdicts(draws, row, rules, slowdown)
    real = realgate.gate_verdicts(draws, row, profile, rules.confirm, slowdown, 1500)
    # Draw by draw the same verdict, and the bulk's rate within the interval of the real code's.
    assert np.array_equal(modelled[:1500], real)
    assert rate(modelled == model.REGRESSION).overlaps(rate(real == model.REGRESSION))
    assert 0 < np.mean(real == model.REGRESSION) < 1


def test_the_cv_limit_and_the_spread_rule_are_the_gates() -> None:
    # Spreads well beyond what the typical rows draw: the CV limit and the spread rule must decide as judging does.
    rng = np.random.default_rng(3)
    size = 1500
    base = model.Summaries(1 + 0.02 * rng.standard_normal(size), rng.uniform(0.001, 0.05, size), 60)
    run = model.Summaries(rng.uniform(0.85, 1.02, size), rng.uniform(0.001, 0.25, size), 20)
    row = Row(0.01, 0.0, 0.0, 20, 3, 0.03)
    draws = model.GateDraws(base, (run, run))
    modelled = model.gate_verdicts(draws, row, model.Rules.of(H100), 0.0)
    real = realgate.gate_verdicts(draws, row, H100, 1, 0.0, size)
    assert np.array_equal(modelled, real)
    assert {model.PASS, model.REGRESSION, model.UNRELIABLE} <= set(real.tolist())


def test_the_old_fixed_ab_of_the_committed_trials_is_abtest_compare() -> None:
    row = Row(0.08, 0.027, 0.0, 12, 1, 0.10)
    draws = model.pair_draws(row, 3, np.random.default_rng(5), 20_000)
    for slowdown in (0.0, 0.15):
        modelled = model.fixed_ab_verdicts(draws, model.FIXED_AB_REV_TOLERANCE, slowdown)
        real = realgate.fixed_ab_verdicts(draws, model.FIXED_AB_REV_TOLERANCE, slowdown, 400)
        assert np.array_equal(modelled[:400], real)
        assert rate(modelled).overlaps(rate(real))
    # Only the historical trials of that design are judged by it: the ab-rev ones ran its tolerance.
    assert {t.ab_tolerance for t in COMMITTED if t.mode == "ab" and t.pairs == 3} == {model.FIXED_AB_REV_TOLERANCE}


@pytest.mark.parametrize(
    ("row", "design"),
    [
        # cpu's typical row at its 10% minimum effect; a noisier one that often runs out of pairs; the
        # H100's at 2%, and at 1% with 12 pairs.
        (Row(0.053, 0.027, 0.0, 12, 1, 0.4), Design(0.10)),
        (Row(0.15, 0.03, 0.0, 12, 1, 0.4), Design(0.10, max_pairs=5)),
        (Row(0.019, 0.0045, 0.0, 20, 3, 0.057), Design(0.02)),
        (Row(0.019, 0.0045, 0.0, 20, 3, 0.057), Design(0.01, max_pairs=12)),
    ],
    ids=["cpu", "cpu-noisy", "h100", "h100-1pct"],
)
def test_the_vectorised_sequential_ab_is_run_ab(row: Row, design: Design) -> None:
    draws = model.pair_draws(row, design.max_pairs, np.random.default_rng(11), 5000)
    seen: set[int] = set()
    for slowdown in (0.0, design.min_effect / 2, design.min_effect, 2 * design.min_effect):
        codes, spent = model.sequential_verdicts(draws, design, slowdown)
        real, real_spent = realgate.sequential_verdicts(draws, design, slowdown, 300)
        # Draw for draw the same verdict after the same pairs, through Trial's looks pair by pair.
        assert np.array_equal(codes[:300], real) and np.array_equal(spent[:300], real_spent)
        assert set(codes.tolist()) <= {sequential.REGRESSION, sequential.PASS, sequential.UNDECIDED}
        assert ((spent >= design.first_look) & (spent <= design.max_pairs)).all()
        assert (spent[codes == sequential.UNDECIDED] == design.max_pairs).all()
        seen |= set(real.tolist())
    assert {sequential.REGRESSION, sequential.PASS} <= seen


def test_the_sequential_ab_keeps_its_promised_rates_at_the_modelled_noise() -> None:
    # The design promises regression at 0% at most alpha and pass at the minimum effect at most beta.
    for name in ("cpu", "nvidia-h100-x1"):
        noise = noise_of(name)
        profile = CPU if name == "cpu" else H100
        row, design = typical_row(noise, profile), Design(profile.min_effect)
        draws = model.pair_draws(row, design.max_pairs, np.random.default_rng(2), 20_000)
        false_alarms = model.sequential_verdicts(draws, design, 0.0)[0] == sequential.REGRESSION
        passed = model.sequential_verdicts(draws, design, design.min_effect)[0] == sequential.PASS
        assert rate(false_alarms).interval()[0] <= design.alpha
        assert rate(passed).interval()[0] <= design.beta
    with pytest.raises(ValueError, match="draws of 8 pairs"):
        model.sequential_verdicts(model.pair_draws(row, 3, np.random.default_rng(0), 10), design, 0.0)


def test_the_command_prints_rates_with_intervals_for_cpu_and_the_h100(tmp_path: Path) -> None:
    # One committed row per profile keeps the per-row table short.
    for profile, group, scenario in (("cpu", "mixed_precision", "amp"), (H100.name, "graph_optimization", "amp")):
        committed = json.loads((ROOT / "baselines" / profile / f"{group}.json").read_text())
        entry = committed["scenarios"][f"{group}.{scenario}"]
        (tmp_path / profile).mkdir()
        (tmp_path / profile / f"{group}.json").write_text(
            json.dumps({**committed, "scenarios": {f"{group}.{scenario}": entry}})
        )
    argv = [
        "selftest",
        "--simulate",
        "--profile",
        "cpu",
        "--perf-profile",
        "nvidia-h100-x1",
        "--draws",
        "3000",
        "--baselines",
        str(tmp_path),
    ]
    # A process of its own: it collects bench_tests to learn each row's tier, and an in-process
    # collection here would meet this run's own test modules of the same names (tests/test_*.py).
    done = subprocess.run(
        [sys.executable, "-m", "perfsuite", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    sections = out.split("\n== ")[1:]
    assert [s.split(":")[0] for s in sections] == ["cpu", H100.name]
    for section, effect, half in zip(sections, ("10%", "2.0%"), ("5.0%", "1.0%"), strict=True):
        for level, change in (("0", "-0.0%"), ("3", "-2.9%"), ("5", "-4.8%"), ("10", "-9.1%")):
            line = next(x for x in section.splitlines() if re.match(rf"\s+{level}%\s+{re.escape(change)}\s", x))
            assert len(re.findall(INTERVAL, line)) == 2 and "agrees" in line, line
        assert re.search(r"per session\s+\d", section) and "docs/" in section
        # The sequential A/B of the typical row: the profile's minimum effect, checked by run_ab draw for draw...
        blocks = section.split("    minimum effect ")[1:]
        assert blocks[0].startswith(f"{effect} (the profile's), at most 8 pairs:")
        rows = [x for x in blocks[0].splitlines() if re.match(r"\s+[\d.]+%\s+-[\d.]+%\s", x)]
        assert [x.split()[0] for x in rows] == ["0.0%", half, effect]
        for line in rows:
            assert len(re.findall(INTERVAL, line)) == 2 and "same verdict and pairs in 1,000 of 1,000" in line, line
            assert re.search(rf"{INTERVAL}\s+\d+\.\d\d\s+\d+\s+same", line), line
        # ...and what 1% costs, at 8 pairs and at 20.
        assert [b.split(":")[0] for b in blocks[1:]] == [
            "1.0% (what 1% costs; 3,000 A/Bs a level), at most 8 pairs",
            "1.0% (what 1% costs; 3,000 A/Bs a level), at most 20 pairs",
        ]
        assert "the smallest slowdown caught 9 times in 10" in section
        # Each committed row: m, P(regression) and P(undecided) at 0, m/2 and m, mean and p95 pairs, the
        # gate's and the A/B's smallest detectable slowdown (with the A/B's mean pairs).
        figures = r"(?:\s+[\d.]+%){4}(?:\s+[\d.]+%){6}(?:\s+\d+\.\d){3}(?:\s+\d+){3}"
        caught = r"\s+\d[\d.]*% \(-[\d.]+%\)\s+\d[\d.]*% \(-[\d.]+%\), \d+\.\d$"
        assert re.search(rf"\.amp{figures}{caught}", section, re.MULTILINE), section
        # False alarms per run of each tier (the suite collected: both rows are in the pr tier).
        tiers = section.split("  false alarms per run of each tier's committed rows")[1].splitlines()
        assert re.match(rf"\s+pr\s+1\s+{INTERVAL}\s+{INTERVAL}\s+[\d.]+%\s+\S+ -> \S+", tiers[2]), tiers
        assert re.match(r"\s+nightly\s+1\s", tiers[3]), tiers
    assert re.search(r"gate, every 0% trial: observed 2/8 false alarms; .* model rejected", out)
    assert "ab mixed_precision.amp (fixed, 3 pairs)" in out


def test_selftest_still_needs_k_unless_it_simulates(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["selftest"])
    assert "-k is required (unless --simulate)" in capsys.readouterr().err
    assert main(["selftest", "--simulate", "--profile", "nvidia-h900"]) == 2
    assert "no measured variance components for profile 'nvidia-h900'" in capsys.readouterr().err
    assert main(["selftest", "--simulate", "--max-pairs", "201"]) == 2
    assert "max_pairs <= 200" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["selftest", "--simulate", "--pairs", "1"])


def test_a_missing_or_broken_baselines_folder_is_named_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["selftest", "--simulate", "--profile", "cpu", "--draws", "200", "--baselines"]
    assert main([*argv, str(tmp_path / "nope")]) == 2
    assert f"--baselines {tmp_path / 'nope'}: no such folder" in capsys.readouterr().err
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "bootstrap-costs.json").write_text("{}")  # the bootstrap's, no group: not read as one
    assert main([*argv, str(tmp_path)]) == 0
    (tmp_path / "cpu" / "microbench.json").write_text('{"schema_version": 1, "scen')
    assert main([*argv, str(tmp_path)]) == 2
    assert f"baseline file {tmp_path / 'cpu' / 'microbench.json'}: content is not valid JSON" in capsys.readouterr().err


def _entry(cv: float, n: int = 20, launches: int = 3, **extra: object) -> BaselineEntry:
    stored = {"mean": 100.0, "std": 100.0 * cv, "n": n * launches}
    return BaselineEntry(
        "ok",
        {"samples_per_s": stored},
        {"samples_per_s": 0.05},
        {},
        extra={"calibration": {"repeats": launches}, **extra},
    )


def test_the_smallest_detectable_slowdown_grows_with_the_spread_and_shrinks_with_pairs() -> None:
    steady, noisy = minimum_detectable(_entry(0.01), H100), minimum_detectable(_entry(0.06), H100)
    assert steady is not None and noisy is not None and steady < noisy
    # Beyond the 5% tolerance (throughput -4.8% at 5%), but not far beyond on a steady row.
    assert 0.05 < steady < 0.15
    # The sequential A/B with at most 3 pairs against cpu's 10% runs out of pairs on a noisy row; 10 decide.
    few, many = minimum_detectable(_entry(0.12), CPU, pairs=3), minimum_detectable(_entry(0.12), CPU, pairs=10)
    assert few is not None and many is not None and many < few
    # Near the GPU's 15% CV limit a run and its confirmation both under it are under 9 in 10.
    assert minimum_detectable(_entry(0.12), H100) is None


def test_the_ab_catches_about_its_minimum_effect_and_says_what_it_costs() -> None:
    # A steady H100 row: about the 2% minimum effect, in 2 to 5 pairs; a noisier one costs more of both.
    steady, noisy = ab_minimum_detectable(_entry(0.01), H100), ab_minimum_detectable(_entry(0.06), H100)
    assert steady is not None and noisy is not None
    assert 0.015 < steady.slowdown < 0.025 and 2 <= steady.mean_pairs < 5
    assert noisy.slowdown > steady.slowdown and noisy.mean_pairs > steady.mean_pairs
    assert minimum_detectable(_entry(0.01), H100, pairs=8) == steady.slowdown
    # A scenario's own minimum effect, where its baseline records one, is the one decided against.
    own = _entry(0.01, min_effect=0.05)
    assert min_effect_of(own, H100) == (0.05, "the scenario's") and min_effect_of(_entry(0.01), H100)[0] == 0.02
    found = ab_minimum_detectable(own, H100)
    assert found is not None and 0.04 < found.slowdown < 0.06
    assert minimum_detectable(own, H100, pairs=8, min_effect=0.02) == steady.slowdown
    said = sensitivity(_entry(0.01), H100)
    assert re.match(
        r"caught 9 times in 10 .*: a slowdown of [\d.]+% \(throughput -[\d.]+%\) by this gate, "
        r"[\d.]+% \(throughput -[\d.]+%\) by the sequential A/B \(ab-rev, --perf-ab\) in [\d.]+ pairs on "
        r"average \(at most 8; minimum effect 2.0%, the profile's\)$",
        said,
    ), said
    assert "minimum effect 5.0%, the scenario's" in sensitivity(own, H100)
    assert sensitivity(_entry(0.01), H100, min_effect=0.03).endswith("minimum effect 3.0%, the scenario's)")


def _options(*observed: Trials) -> Options:
    return Options(
        profiles=("nvidia-h100-x1",),
        baselines=Path("/nonexistent"),
        draws=500,
        check=50,
        histories=4000,
        observed=observed,
    )


def test_trials_the_model_cannot_explain_say_it_is_rejected() -> None:
    seen = Trials(H100.name, "some.row", 0.0, 8, 2, "s2", "s1", "a test", worst=-0.14)
    out = "\n".join(report(_options(seen)))
    assert re.search(
        r"observed 2/8 false alarms; the model predicts [\d.]+% a trial; P\(>=2 of 8 \| model\) = "
        r"[\d.e-]+: model rejected",
        out,
    )
    assert re.search(r"worst 0% reading -14.0%: P\(a trial reads that low \| model\) = < [\d.e-]+: model rejected", out)
    quiet = Trials(H100.name, "some.row", 0.0, 8, 0, "s2", "s1", "a test")
    assert re.search(r"observed 0/8 false alarms; .*: consistent", "\n".join(report(_options(quiet))))


# -- the components are the committed data --------------------------------------------------------
def _drift_runs() -> list[dict[str, dict[str, float]]]:
    runs = []
    for path in sorted((ROOT / "docs" / "lab" / "drift").glob("*.json.gz")):
        results = json.loads(gzip.decompress(path.read_bytes()))["results"]
        metric = [(r["id"], (r.get("metrics") or {}).get("samples_per_s")) for r in results if r.get("status") == "ok"]
        runs.append({sid: m for sid, m in metric if isinstance(m, dict)})
    return runs


def _ab_rev_launch_cv() -> float:
    """Each 0% trial's 95% interval of 3 pair ratios gives their spread; per launch: over sqrt 2."""
    from scipy import stats

    text = (ROOT / "docs" / "lab" / "drift" / "ab-rev-detection-2026-11-26.txt").read_text()
    found = re.findall(r"level 0 trial .*?samples_per_s\s+\S+\s+([+-][\d.]+)% \.\. ([+-][\d.]+)%", text)
    spreads = [(float(hi) - float(lo)) / 2 * math.sqrt(3) / stats.t.ppf(0.975, 2) / 100 for lo, hi in found]
    assert len(spreads) == 10
    return math.sqrt(statistics.fmean(s * s for s in spreads)) / math.sqrt(2)


def test_the_cpu_components_are_the_committed_drift_runs() -> None:
    runs, cpu = _drift_runs(), PROFILES["cpu"]
    rows = sorted(set.intersection(*(set(r) for r in runs)))
    assert len(runs) == 8 and len(rows) == 28
    step = {sid: statistics.fmean(r[sid]["std"] / r[sid]["mean"] for r in runs) for sid in rows}
    amp = "mixed_precision.amp"
    launch = math.sqrt(_ab_rev_launch_cv() ** 2 - step[amp] ** 2 / runs[0][amp]["n"])
    session = []
    for sid in rows:
        means = [r[sid]["mean"] for r in runs]
        between = statistics.stdev(means) / statistics.fmean(means)
        session.append(math.sqrt(max(0.0, between**2 - launch**2 - step[sid] ** 2 / runs[0][sid]["n"])))
    assert cpu.step_cv.value == pytest.approx(statistics.median(step.values()), abs=0.001)
    assert cpu.launch_cv.value == pytest.approx(launch, abs=0.001)
    assert cpu.session_cv.value == pytest.approx(statistics.median(session), abs=0.001)


def test_the_h100_step_spread_is_its_committed_training_rows() -> None:
    spreads = []
    for path in (ROOT / "baselines" / H100.name).glob("*.json"):
        for entry in json.loads(path.read_text()).get("scenarios", {}).values():
            stored = entry["metrics"].get("samples_per_s")
            spreads += [stored["std"] / stored["mean"]] if isinstance(stored, dict) else []
    assert len(spreads) == 7
    assert PROFILES[H100.name].step_cv.value == pytest.approx(statistics.median(spreads), abs=0.001)


def test_a_runs_false_alarms_are_its_rows_failing_together_through_their_shared_session() -> None:
    """Rows whose steps and launches do not spread fail only by the sessions' offsets: a loss beyond the
    tolerance of the difference of two N(0, s) offsets, Phi(-tol / (s sqrt 2)) a row (7.9% at tol = 2s).
    Rows of one run share its offsets, so they fail together: the run's rate is one row's, not the
    independent 1 - (1 - p)^n, and never above Bonferroni's bound."""
    from scipy.stats import norm

    from perfsuite.judge.simulate.family import run_false_alarms

    rules = model.Rules(max_cv=1.0, spread_growth=None)
    row = Row(step_cv=1e-6, launch_cv=0.0, session_cv=0.02, steps=50, baseline_launches=1, tolerance=0.04)
    expected = norm.cdf(-0.04 / (0.02 * math.sqrt(2)))
    one = run_false_alarms([("a", row)], rules, draws=40_000)
    assert one.per_row[0] == pytest.approx(expected, abs=0.006) and one.joint.value == one.per_row[0]
    three = run_false_alarms([(name, row) for name in "abc"], rules, draws=40_000)
    assert three.joint.value == pytest.approx(expected, abs=0.006)
    assert three.independent == pytest.approx(1 - (1 - expected) ** 3, abs=0.015) and three.bound >= three.independent
    # Without a session offset the rows are independent: the run's rate is the product's.
    apart = Row(
        step_cv=1e-6, launch_cv=0.02 * math.sqrt(2), session_cv=0.0, steps=50, baseline_launches=1, tolerance=0.04
    )
    loose = run_false_alarms([(name, apart) for name in "abc"], model.Rules(max_cv=1.0, spread_growth=None, confirm=0))
    assert loose.joint.value == pytest.approx(loose.independent, abs=0.01) and loose.joint.value > 0.1
    assert [p for _, p in three.worst()] == sorted(three.per_row, reverse=True)
    assert "fails at least one in" in three.describe() and "3 timing-judged rows" in three.describe()
