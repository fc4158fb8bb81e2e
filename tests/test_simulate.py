"""``selftest --simulate``: the vectorised model is the gate's own judging code, its inputs are the
committed data, and what it prints (rates with intervals, the model's verdict on the committed
trials, each row's smallest detectable slowdown) behaves. Seconds, no launch."""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from perfsuite.__main__ import main
from perfsuite.judge.simulate import minimum_detectable, model, realgate
from perfsuite.judge.simulate.cli import Options, report
from perfsuite.judge.simulate.noise import PROFILES, Row, noise_of, typical_row
from perfsuite.judge.simulate.rates import rate
from perfsuite.judge.simulate.trials import Trials
from perfsuite.spec.profiles import CPU, HardwareProfile, gpu_profile
from perfsuite.store.baselines import BaselineEntry

ROOT = Path(__file__).resolve().parents[1]
H100 = gpu_profile("nvidia-h100-80gb-hbm3-x1")
INTERVAL = r"\d[\d.]*% \(\d[\d.]*%-\d[\d.]*%\)"


@pytest.mark.parametrize("profile", [CPU, H100], ids=["cpu", "h100"])
@pytest.mark.parametrize("slowdown", [0.0, 0.05, 0.10])
def test_the_vectorised_gate_is_the_gates_own_judging_code(profile: HardwareProfile, slowdown: float) -> None:
    noise = noise_of(profile.name)
    # Twice the tolerance's worth of session spread: failures at every level, not only at the extremes.
    row = Row(noise.step_cv.value, noise.launch_cv.value, 0.5 * typical_row(noise, profile).tolerance,
              noise.steps, noise.baseline_launches, typical_row(noise, profile).tolerance)  # fmt: skip
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


def test_the_vectorised_ab_is_abtest_compare() -> None:
    row = Row(0.08, 0.027, 0.0, 12, 1, 0.10)
    draws = model.pair_draws(row, 3, np.random.default_rng(5), 20_000)
    for slowdown in (0.0, 0.15):
        modelled = model.ab_verdicts(draws, 0.10, slowdown)
        real = realgate.ab_verdicts(draws, 0.10, slowdown, 400)
        assert np.array_equal(modelled[:400], real)
        assert rate(modelled).overlaps(rate(real))


def test_the_command_prints_rates_with_intervals_for_cpu_and_the_h100(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One committed row per profile keeps the per-row table short.
    for profile, group, scenario in (("cpu", "mixed_precision", "amp"), (H100.name, "graph_optimization", "amp")):
        committed = json.loads((ROOT / "baselines" / profile / f"{group}.json").read_text())
        entry = committed["scenarios"][f"{group}.{scenario}"]
        (tmp_path / profile).mkdir()
        (tmp_path / profile / f"{group}.json").write_text(
            json.dumps({**committed, "scenarios": {f"{group}.{scenario}": entry}})
        )
    argv = ["selftest", "--simulate", "--profile", "cpu", "--perf-profile", "nvidia-h100-x1", "--draws", "3000",
            "--baselines", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    sections = out.split("\n== ")[1:]
    assert [s.split(":")[0] for s in sections] == ["cpu", H100.name]
    for section in sections:
        for level, change in (("0", "-0.0%"), ("3", "-2.9%"), ("5", "-4.8%"), ("10", "-9.1%")):
            line = next(x for x in section.splitlines() if re.match(rf"\s+{level}%\s+{re.escape(change)}\s", x))
            assert len(re.findall(INTERVAL, line)) == 3 and "agrees" in line, line
        assert re.search(r"per session\s+\d", section) and "docs/" in section
        assert "smallest slowdown caught 9 times in 10" in section
        assert re.search(r"\.amp\s+.*\d+% \(-[\d.]+%\)\s+\d+% \(-[\d.]+%\)\s+\d+% \(-[\d.]+%\)", section)
    assert re.search(r"gate, every 0% trial: observed 2/8 false alarms; .* model rejected", out)


def test_selftest_still_needs_k_unless_it_simulates(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["selftest"])
    assert "-k is required (unless --simulate)" in capsys.readouterr().err
    assert main(["selftest", "--simulate", "--profile", "nvidia-h900"]) == 2
    assert "no measured variance components for profile 'nvidia-h900'" in capsys.readouterr().err


def _entry(cv: float, n: int = 20, launches: int = 3) -> BaselineEntry:
    stored = {"mean": 100.0, "std": 100.0 * cv, "n": n * launches}
    return BaselineEntry("ok", {"samples_per_s": stored}, {"samples_per_s": 0.05}, {},
                         extra={"calibration": {"repeats": launches}})  # fmt: skip


def test_the_smallest_detectable_slowdown_grows_with_the_spread_and_shrinks_with_pairs() -> None:
    steady, noisy = minimum_detectable(_entry(0.01), H100), minimum_detectable(_entry(0.06), H100)
    assert steady is not None and noisy is not None and steady < noisy
    # Beyond the 5% tolerance (throughput -4.8% at 5%), but not far beyond on a steady row.
    assert 0.05 < steady < 0.15
    few, many = minimum_detectable(_entry(0.12), CPU, pairs=3), minimum_detectable(_entry(0.12), CPU, pairs=10)
    assert few is not None and many is not None and many < few
    # Near the GPU's 15% CV limit a run and its confirmation both under it are under 9 in 10.
    assert minimum_detectable(_entry(0.12), H100) is None


def _options(*observed: Trials) -> Options:
    return Options(profiles=("nvidia-h100-x1",), baselines=Path("/nonexistent"), draws=500, check=50, histories=4000,
                   observed=observed)  # fmt: skip


def test_trials_the_model_cannot_explain_say_it_is_rejected() -> None:
    seen = Trials(H100.name, "some.row", 0.0, 8, 2, "s2", "s1", "a test", worst=-0.14)
    out = "\n".join(report(_options(seen)))
    assert re.search(r"observed 2/8 false alarms; the model predicts [\d.]+% a trial; P\(>=2 of 8 \| model\) = "
                     r"[\d.e-]+: model rejected", out)  # fmt: skip
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
