from __future__ import annotations

import pytest

from perfsuite.__main__ import build_parser, calibrate_args


def test_calibrate_builds_the_pytest_command() -> None:
    ns, extra = build_parser().parse_known_args(["calibrate", "-k", "zero", "--repeats", "5", "-x"])
    assert calibrate_args(ns, extra) == [
        "bench_tests",
        "--perf-calibrate",
        "--perf-repeats=5",
        "-p",
        "no:cacheprovider",
        "-k",
        "zero",
        "-x",
    ]


def test_calibrate_refuses_a_single_repeat() -> None:
    ns, extra = build_parser().parse_known_args(["calibrate", "--repeats", "1"])
    with pytest.raises(SystemExit, match="--repeats must be >= 2"):
        calibrate_args(ns, extra)
