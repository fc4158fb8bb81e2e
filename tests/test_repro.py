"""The commands a failed row prints (:mod:`perfsuite.judge.repro`): its rerun judges as the failed
run did, the A/B and the bisect leave out what would defeat them. The printed command, run, is
in tests/test_plugin_e2e.py."""

from __future__ import annotations

import shlex

import pytest

from perfsuite.judge.repro import repro, settings_flags
from perfsuite.plugin.options import JUDGING_FLAGS

NODE = "bench_tests/test_mixed_precision.py::test_mixed_precision[mixed_precision.fp32]"


def test_the_flags_that_decide_a_judgement_are_kept_in_one_word_each_and_the_profile_pinned() -> None:
    args = ["-q", "--perf-baselines", "ci/baselines", "-k", "fp32", "--perf-work=off", "--perf-json=r.json"]
    assert settings_flags(args, "cpu", JUDGING_FLAGS) == (
        "--perf-profile=cpu",
        "--perf-baselines=ci/baselines",
        "--perf-work=off",
    )
    assert settings_flags(["--perf-profile", "h100", "--perf-rank-start=exec"], "cpu", JUDGING_FLAGS) == (
        "--perf-profile=h100",
        "--perf-rank-start=exec",
    )
    assert settings_flags(["--perf-timeout"], "cpu", JUDGING_FLAGS) == (
        "--perf-profile=cpu",
    )  # a flag without its value


def test_the_commands_quote_the_node_and_the_ab_drops_what_would_defeat_it() -> None:
    flags = ("--perf-profile=cpu", "--perf-baselines=b", "--perf-inject-slowdown=20", "--perf-rank-start=exec")
    found = repro(NODE, flags, {"provenance": {"commit": "0123456789abcdef0123", "dirty": False}})
    assert shlex.split(found.rerun) == ["pytest", NODE, *flags]
    assert shlex.split(found.ab_rev) == ["python", "-m", "perfsuite", "ab-rev", "HEAD~1", NODE, flags[0], flags[3]]
    assert found.bisect is not None
    assert shlex.split(found.bisect)[3:6] == ["bisect", "0123456789ab", "HEAD"]
    assert found.lines()[2].startswith("find the commit: python -m perfsuite bisect 0123456789ab HEAD")


def test_a_baseline_from_a_dirty_or_unknown_checkout_names_no_good_commit() -> None:
    assert repro(NODE, (), {"provenance": {"commit": "0123456789abcdef", "dirty": True}}).bisect is None
    assert repro(NODE, (), {"provenance": {"commit": None, "dirty": False}}).bisect is None
    assert repro(NODE, (), None).bisect is None
    assert len(repro(NODE, (), None).lines()) == 2


def test_every_judging_flag_is_one_the_plugin_declares(pytestconfig: pytest.Config) -> None:
    """A renamed option would drop out of the rerun command silently (getoption refuses an unknown one)."""
    for flag in JUDGING_FLAGS:
        pytestconfig.getoption(flag)
