"""The HTML report and the summary table (``python -m perfsuite report|summary``).

The page is checked in a real headless Chromium driven over the DevTools
protocol (``--remote-debugging-pipe``): every embedded chart must load, the
console must stay free of errors, and a screenshot must come back. A planted
broken page shows the check catches errors.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import CPU_PROFILE, TINY_SHAPE, bench_module

from perfsuite.__main__ import main
from perfsuite.judge.compare import FAILING
from perfsuite.judge.coverage import Outcome, coverage_of
from perfsuite.reports.html import results as res
from perfsuite.reports.html import summary

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def judged(scenario_id: str, verdict: str, mean: float, base: float, message: str = "") -> dict[str, Any]:
    """A result as the results file holds it: 4 warmup and 8 measured steps of 8 samples, 2 ranks."""
    times = [8 / mean] * 8
    return {
        "id": scenario_id,
        "group": scenario_id.split(".")[0],
        "status": "ok",
        "verdict": verdict,
        "message": message,
        "config": {"kind": "train", "world_size": 2, "reference": "A1 fp32: 103.07 +/- 1.03 samples/s"},
        "metrics": {
            "samples_per_s": {"mean": mean, "std": mean / 20, "n": 8},
            "peak_mem_mib": 512.4,
            "step_times_s": times,
            "warmup_times_s": [0.5, 0.3, 0.2, 0.2],
            "per_rank": [{"rank": r, "samples_per_s": mean, "peak_mem_mib": 500.0 + r} for r in (0, 1)],
        },
        "baseline": {"metrics": {"samples_per_s": {"mean": base, "std": base / 10, "n": 8}}},
        "checks": [{"metric": "samples_per_s", "delta": mean / base - 1, "tolerance": 0.4, "direction": "higher"}],
    }


def document() -> dict[str, Any]:
    return {
        "profile": "cpu",
        "machine": {"host": "vm", "cpu": "x86_64", "gpus": [], "packages": {"torch": "2.13.0"}},
        "results": [
            judged("mp.fp32", "pass", 80.0, 100.0),
            judged("mp.amp", "regression", 50.0, 100.0, "samples_per_s 50 vs baseline 100 | slower"),
            {"id": "mp.big", "status": "skipped", "verdict": "skipped", "message": "needs 4 ranks", "metrics": {}},
        ],
        "relations": [{"id": "mp.samples_per_s:amp>fp32", "status": "violated", "message": "50 > 80 is false"}],
    }


def test_markdown_summary_marks_verdicts_and_keeps_cells_whole() -> None:
    text = summary.markdown(document())
    lines = text.splitlines()
    assert lines[0] == "## perfsuite: profile cpu: 1 pass, 1 regression, 1 skipped"
    assert "| `mp.fp32` | ✅ pass | 80 +/- 4 samples/s | -20.0% | 40% | 512 |  |" in lines
    (regressed,) = [line for line in lines if line.startswith("| `mp.amp`")]
    assert "❌ regression" in regressed and "baseline 100 \\| slower" in regressed
    assert regressed.count(" | ") == len(summary.columns(document())) - 1  # the message's pipe is escaped, not a column
    assert "| `mp.big` | ⏭️ skipped | - | - | - | - | needs 4 ranks |" in lines
    assert "| `mp.samples_per_s:amp>fp32` | violated | 50 > 80 is false |" in lines


def test_the_job_summary_opens_with_the_coverage_line_and_its_fixes() -> None:
    doc = document()
    found = coverage_of(Outcome(r["id"], r["verdict"], r["message"]) for r in doc["results"])
    lines = summary.markdown({**doc, "coverage": found.to_json()}).splitlines()
    assert (
        lines[2]
        == "**✅ judged 2 of 3 selected scenario(s); not for this machine: 1; judged: memory 0, timing 0 of 3**"
    )
    doc["results"][0]["verdict"] = "no_baseline"
    found = coverage_of(Outcome(r["id"], r["verdict"], r["message"]) for r in doc["results"])
    lines = summary.markdown({**doc, "coverage": found.to_json()}).splitlines()
    assert lines[2].startswith("**❌ judged 1 of 3 selected scenario(s); not judged: 1 no baseline")
    assert lines[3].startswith("- no_baseline: mp.fp32: record baselines")
    # A run that judged timing states its modelled chance of a false alarm under the line, here and on the page.
    said = "false alarms: an unchanged run of these 2 timing-judged rows fails at least one in 0.47% of runs"
    stated = {**doc, "coverage": found.to_json(), "false_alarms": {"line": said}}
    assert f"- {said}" in summary.markdown(stated).splitlines()
    pytest.importorskip("jinja2", reason="the report extra: pip install 'perfsuite[report]'")
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    from perfsuite.reports.html.page import render

    assert f'<p class="note">{said}</p>' in render(stated, "results.json")


def test_summary_command_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document()))
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "profile cpu: 1 pass, 1 regression, 1 skipped"
    assert out[1].split() == [*summary.BASE_COLUMNS[:5], "peak", "MiB", "detail"]
    assert out[3].split()[:5] == ["mp.fp32", "pass", "80", "+/-", "4"]
    assert main(["summary", "--markdown", str(path)]) == 0
    assert capsys.readouterr().out == summary.markdown(document())


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"profile": "cpu"}', "not a perfsuite results file (no 'results' list)"),
        ('{"profile": "cpu", "results": [{"id": "x"}]}', "results[0] lacks 'id', 'status' or 'verdict'"),
    ],
)
@pytest.mark.parametrize("command", ["report", "summary"])
def test_bad_input_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, content: str | None, expected: str
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    assert (
        main([command, str(path), "-o", str(tmp_path / "page.html")] if command == "report" else [command, str(path)])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"perfsuite {command}: {path}: ") and expected in err and err.count("\n") == 1
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize(
    ("where", "name", "value", "expected"),
    [
        ("top", "machine", "x", "'machine' is not an object"),
        ("top", "relations", [1], "'relations' is not a list of objects"),
        ("top", "ranking", [1], "'ranking' is not an object"),
        ("top", "ceilings", {"fp32": 1}, "'ceilings' is not an object of objects"),
        ("top", "coverage", {"a": 1}, "'coverage' lacks its 'line' or 'ok'"),
        ("result", "config", "x", "results[0] (mp.fp32): 'config' is not an object"),
        ("result", "checks", [1], "results[0] (mp.fp32): 'checks' is not a list of objects"),
        ("result", "op_profile", {"a": 1}, "results[0] (mp.fp32): 'op_profile' cannot be read (KeyError('current'))"),
        ("metric", "per_rank", [1], "results[0] (mp.fp32): metrics.'per_rank' is not a list of objects"),
        ("metric", "step_times_s", ["x"], "results[0] (mp.fp32): metrics.'step_times_s' is not a list of numbers"),
    ],
)
@pytest.mark.parametrize("command", ["report", "summary", "compare", "explain"])
def test_a_field_of_the_wrong_shape_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, where: str, name: str, value: Any, expected: str
) -> None:
    doc = document()
    node = {"top": doc, "result": doc["results"][0], "metric": doc["results"][0]["metrics"]}[where]
    node[name] = value
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    argv = {"report": [str(path), "-o", str(tmp_path / "page.html")], "compare": [str(path), str(path)]}
    assert main([command, *argv.get(command, [str(path)])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfsuite {command}: {path}: ") and expected in err and err.count("\n") == 1, err


def test_report_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document()))
    import perfsuite.reports.html as package

    for module in ("perfsuite.reports.html.page", "perfsuite.reports.html.plots"):
        monkeypatch.delitem(sys.modules, module, raising=False)
        # `from perfsuite.reports.html import page` reads the package's attribute first: an earlier
        # test's import left it there.
        monkeypatch.delattr(package, module.rsplit(".", 1)[1], raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["report", str(path), "-o", str(tmp_path / "page.html")]) == 2
    assert "pip install 'perfsuite[report]'" in capsys.readouterr().err


def test_verdict_styles_mark_exactly_the_failing_verdicts() -> None:
    assert {v for v, style in res.VERDICT_STYLE.items() if style == "bad"} == FAILING


@pytest.mark.parametrize(
    ("config", "checks", "expected"),
    [
        ({"kind": "train"}, [], "samples_per_s"),  # not samples_per_ref, which sorts first in the file
        ({"kind": "collective"}, [], "busbw_gbps"),  # not algbw_gbps
        ({"kind": "microbench"}, [], "tflops"),
        ({"kind": "custom", "primary": "tokens_per_s"}, [], "tokens_per_s"),
        ({"kind": "custom"}, [{"metric": "peak_mem_mib"}], "peak_mem_mib"),
        ({"kind": "custom"}, [], None),
    ],
)
def test_primary_metric_is_the_kinds_own(config: dict[str, Any], checks: list[Any], expected: str | None) -> None:
    metrics = {"algbw_gbps": 1.0, "busbw_gbps": 2.0, "samples_per_ref": 3.0, "samples_per_s": 4.0}
    assert res.primary_metric({"config": config, "checks": checks, "metrics": metrics}) == expected


def test_baseline_band_is_the_baseline_rate_as_step_times() -> None:
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    from perfsuite.reports.html.plots import baseline_band

    # 8 samples a step at 80 samples/s; baseline 100 +/- 10, 40% tolerance.
    at, fast, slow, limit = baseline_band(judged("mp.fp32", "pass", 80.0, 100.0))
    assert (at, fast, slow, limit) == pytest.approx((8 / 100, 8 / 110, 8 / 90, 8 / 60))
    result = judged("mp.fp32", "pass", 80.0, 100.0)
    result["checks"] = []
    assert baseline_band(result) is None


class DevTools:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe``: JSON
    messages ending in a NUL byte, commands on the browser's fd 3 and replies
    and events on its fd 4."""

    def __init__(self, profile_dir: Path) -> None:
        to_browser, self._send_fd = os.pipe()
        self._recv_fd, from_browser = os.pipe()

        def wire() -> None:
            # Copies first: a pipe end may already sit on fd 3 or 4, and dup2
            # onto itself would leave it close-on-exec.
            reads, writes = os.dup(to_browser), os.dup(from_browser)
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        command = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"]
        self.process = subprocess.Popen(
            command, preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(to_browser)
        os.close(from_browser)
        self._last_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params}
        os.write(self._send_fd, json.dumps({**message, **({"sessionId": session} if session else {})}).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._last_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_for(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._receive())

    def _receive(self, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._recv_fd], [], [], left)[0], "chromium stopped answering"
            chunk = os.read(self._recv_fd, 1 << 20)
            assert chunk, f"chromium exited ({self.process.poll()})"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def open(self, url: str, width: int = 1280, height: int = 2000) -> dict[str, Any]:
        """Load ``url``; return its images' load state, its console errors and a PNG screenshot."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session)
        self.call(
            "Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1, mobile=False
        )
        self.events.clear()
        self.call("Page.navigate", session, url=url)
        self.wait_for("Page.loadEventFired")
        script = "Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
        images = self.call("Runtime.evaluate", session, expression=script, returnByValue=True)["result"]["value"]
        png = base64.b64decode(self.call("Page.captureScreenshot", session, format="png")["data"])
        errors = [e for e in self.events if console_error(e)]
        self.call("Target.closeTarget", targetId=target)
        return {"images": dict(images), "errors": errors, "png": png}

    def close(self) -> None:
        self.call("Browser.close")
        self.process.wait(timeout=10)
        os.close(self._send_fd)
        os.close(self._recv_fd)


def console_error(event: dict[str, Any]) -> bool:
    """An error in the page's console: a failed load, console.error, an uncaught exception."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Log.entryAdded":
        return bool(params["entry"]["level"] == "error")
    if method == "Runtime.consoleAPICalled":
        return params["type"] in ("error", "assert")
    return method == "Runtime.exceptionThrown"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (sudo bash scripts/system-packages.sh)")
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    devtools = DevTools(tmp_path / "chromium-profile")
    try:
        yield devtools
    finally:
        if devtools.process.poll() is None:
            devtools.close()


def record_history(directory: Path, results: dict[str, Any], shift_at: int, runs: int) -> None:
    """``runs`` copies of ``results`` in a history, samples/s 30% lower from run ``shift_at`` on, where
    torch went from 2.12.0 to 2.13.0."""
    from perfsuite.reports.exports.history import record
    from perfsuite.store.vcs import Commit

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for i in range(runs):
        run = json.loads(json.dumps(results))
        for result in run["results"]:
            rate = result["metrics"]["samples_per_s"]
            rate["mean"] *= (0.7 if i >= shift_at else 1.0) * (1 + 0.01 * (i % 3))
        run["machine"]["packages"]["torch"] = "2.13.0" if i >= shift_at else "2.12.0"
        when = start + timedelta(hours=i)
        record(directory, run, Commit(id=f"{i:02d}" + "c" * 38, time=when.isoformat()), now=when)


def test_report_of_a_real_cpu_run_renders_in_chromium(
    project: pytest.Pytester, browser: DevTools, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A planted broken page: the check must see its failed load and console error.
    bad = tmp_path / "bad.html"
    bad.write_text('<img src="missing.png" alt="missing"><script>console.error("planted")</script>')
    planted = browser.open(bad.as_uri())
    assert planted["images"] == {"missing": False} and len(planted["errors"]) == 2

    scenario = f'Scenario("tiny", "fp32", TINY, {TINY_SHAPE}),'
    project.makepyfile(test_bench=bench_module(scenario))
    out = project.path / "results.json"
    project.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, f"--perf-json={out}").assert_outcomes(skipped=1)
    history = tmp_path / "history"
    record_history(history, json.loads(out.read_text()), shift_at=6, runs=12)

    page = tmp_path / "report.html"
    assert main(["report", str(out), "--history", str(history), "-o", str(page)]) == 0, capsys.readouterr().err
    text = page.read_text()
    assert re.search(r"change point: -(29|30|31)\.\d%", text), "the planted 30% drop was not found"
    assert re.search(r"the environment changed there: torch 2\.12\.0 -(>|&gt;) 2\.13\.0", text)
    assert "tiny.fp32" in text and "no_baseline" in text
    seen = browser.open(page.as_uri())
    assert seen["errors"] == []
    assert seen["images"] == {
        "tiny.fp32: step times and per-rank figures": True,
        "tiny.fp32: samples_per_s over 12 runs": True,
    }
    from PIL import Image

    shot = Image.open(io.BytesIO(seen["png"]))
    assert shot.size == (1280, 2000)
    assert len(shot.convert("RGB").getcolors(maxcolors=1 << 16) or ()) > 50, "the screenshot shows no charts"


def priced(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as a priced run with a stated job and a bf16 ceiling writes it."""
    fp32, amp = document["results"][:2]
    for result, rate, tflops in ((fp32, 80.0, 0.5), (amp, 50.0, 0.3)):
        result["config"].update(precision="bf16")
        per_million = 5.3 * 2 / 3600 / rate * 1e6  # 5.3 CNY per GPU-hour, 2 GPUs
        result["metrics"]["extra"] = {
            "cost": {"gpus": 2, "price_per_gpu_hour": 5.3, "currency": "CNY", "per_million_samples": per_million},
            "ceiling": {"value": tflops / 2.0, "achieved_tflops_per_rank": tflops, "formula": "F"},
        }
    hours = {"mp.fp32": 4096 / 80 / 3600, "mp.amp": 4096 / 50 / 3600}
    job = {
        i: {"samples": 2048, "epochs": 2, "hours": h, "cost": h * 2 * 5.3, "currency": "CNY"} for i, h in hours.items()
    }
    document["ranking"] = {
        "mp": {
            "by_cost": [{"id": i, "cost": job[i]["cost"], "job": job[i]} for i in ("mp.fp32", "mp.amp")],
            "by_time": [
                {"id": i, "samples_per_s": r, "hours": hours[i]} for i, r in (("mp.fp32", 80.0), ("mp.amp", 50.0))
            ],
        }
    }
    document["ceilings"] = {"bf16": {"dtype": "bf16", "tflops": 2.0, "scenario": "microbench.matmul_bf16"}}
    return document


def test_cost_tables_show_each_configurations_price_and_job_estimate() -> None:
    from perfsuite.reports.html import efficiency

    (group,) = efficiency.cost_groups(priced(document()))
    assert group.group == "mp" and group.columns[-2:] == efficiency.JOB_COLUMNS
    assert group.rows[0] == ("mp.fp32", "80", "2", "36.81 CNY", "-", "-", "0.01422", "0.1508 CNY")
    assert group.rows[1][0] == "mp.amp" and group.rows[1][-1] == "0.2412 CNY"
    assert group.cheapest_first == "mp.fp32 < mp.amp"


def test_without_a_price_or_job_the_cost_table_has_times_only() -> None:
    from perfsuite.reports.html import efficiency

    doc = document()
    doc["ranking"] = {
        "mp": {
            "by_cost": [],
            "by_time": [{"id": "mp.fp32", "samples_per_s": 80.0}, {"id": "mp.amp", "samples_per_s": 50.0}],
        }
    }
    (group,) = efficiency.cost_groups(doc)
    assert group.columns == efficiency.COST_COLUMNS and group.cheapest_first == ""
    assert group.rows == [("mp.fp32", "80", "2", "-", "-", "-"), ("mp.amp", "50", "2", "-", "-", "-")]


def test_ceilings_and_achieved_tflops_are_tabulated_with_their_formula() -> None:
    from perfsuite.reports.html import efficiency

    doc = priced(document())
    assert efficiency.ceilings(doc) == [("bf16", "2", "microbench.matmul_bf16")]
    assert efficiency.achieved(doc) == [
        ("mp.fp32", "bf16", "0.5", "25.0%", "-", "-"),
        ("mp.amp", "bf16", "0.3", "15.0%", "-", "-"),
    ]
    assert efficiency.formulas(doc) == ["F"]


def test_the_page_has_the_cost_and_hardware_sections() -> None:
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    from perfsuite.reports.html.page import render

    text = render(priced(document()), "results.json")
    assert 'id="cost"' in text and "Cheapest first: mp.fp32 &lt; mp.amp" in text and "0.1508 CNY" in text
    assert 'id="hardware"' in text and "microbench.matmul_bf16" in text and "25.0%" in text
    bare = render(document(), "results.json")
    assert "No group measured two or more training configurations" in bare
    assert "No matmul microbenchmark ran in this session" in bare
    assert "not judged" not in bare  # an older results file has no coverage: nothing shown
    doc = document()
    doc["coverage"] = coverage_of([Outcome("mp.fp32", "no_baseline"), Outcome("mp.amp", "pass")]).to_json()
    covered = render(doc, "results.json")
    assert (
        '<span class="badge bad">not judged</span> judged 1 of 2 selected scenario(s); not judged: 1 no baseline'
        in covered
    )


def test_a_failed_row_shows_the_commands_that_settle_it() -> None:
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    from perfsuite.reports.html.page import render

    doc = document()
    rerun = "pytest 'bench_tests/test_mp.py::test_mp[mp.fp32]' --perf-profile=cpu"
    doc["results"][0]["repro"] = {"rerun": rerun, "ab_rev": "python -m perfsuite ab-rev HEAD~1 x", "bisect": None}
    text = render(doc, "results.json")
    assert "run it again: pytest &#39;bench_tests/test_mp.py::test_mp[mp.fp32]&#39; --perf-profile=cpu" in text
    assert "settle it on this machine: python -m perfsuite ab-rev HEAD~1 x" in text
    assert "find the commit" not in text and "run it again" not in render(document(), "results.json")
