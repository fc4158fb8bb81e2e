from __future__ import annotations

import pytest

from perfsuite.__main__ import build_parser, calibrate_args, main


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["calibrate", "--repeats", "1"], "argument --repeats: must be 2 or more, got 1"),
        (["calibrate", "--repeats", "x"], "argument --repeats: 'x' is not a whole number"),
        (["selftest", "-k", "a", "--trials", "-1"], "argument --trials: must be 1 or more, got -1"),
        (["selftest", "-k", "a", "--levels", "abc"], "argument --levels: 'abc': give percentages separated by commas"),
        (["selftest", "-k", "a", "--levels", "0,-5"], "a planted slowdown cannot be negative"),
        (["bootstrap", "--budget", "8 minutes"], "argument --budget: '8 minutes': give a positive duration"),
        (["bootstrap", "--repeats", "1"], "argument --repeats: must be 2 or more"),
        (["bootstrap", "--trials", "0"], "argument --trials: must be 1 or more"),
        (["doctor", "--nosuch"], "doctor: unrecognized arguments: --nosuch"),
        (["history", "d", "--max-p", "2"], "argument --max-p: must be between 0 and 1, got 2.0"),
        (["history", "d", "--bogus"], "history: unrecognized arguments: --bogus"),
        (["init", "--bogus"], "init: unrecognized arguments: --bogus"),
        (["ab-rev", "HEAD", "--pairs", "1"], "argument --max-pairs/--pairs: must be 2 or more, got 1"),
    ],
)
def test_every_command_refuses_bad_values_with_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.startswith("usage: perfsuite")
