"""Property-based tests (hypothesis): bad input never gives a traceback from perfsuite.

Three families of generated input, each either accepted or refused with the
project's own error naming the file, field or flag and what to do:

* baseline group files (arbitrary JSON, near-valid documents, raw bytes);
* scenario specs of every workload kind (wrong types, bad numbers, unknown
  strings, inconsistent batches, bad variants);
* command-line flag values, through pytest's real option parser and
  ``pytest_configure`` (fast, directly) and a few end-to-end pytest runs.

Any other exception type (TypeError, KeyError, ZeroDivisionError, an
INTERNALERROR) fails the property. Examples are derandomized and no database
is written, so CI runs the same cases every time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfsuite.core.metrics import METRICS
from perfsuite.core.models import ModelSpec
from perfsuite.core.validation import ScenarioError
from perfsuite.core.workloads import Collective, DeviceCopy, Microbench, Scenario, TrainerScenario
from perfsuite.core.workloads.base import OUTCOMES, BaseScenario
from perfsuite.launch.envs import CURRENT, EnvError, parse_ab, parse_envs
from perfsuite.plugin import hooks as plugin
from perfsuite.store.baselines import BaselineEntry, BaselineError, BaselineStore, load_group_file

FAST = settings(max_examples=150, deadline=None, derandomize=True, database=None)
#: Each end-to-end pytest run costs ~0.5 s: few examples.
SLOW = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FIXTURE = [HealthCheck.function_scoped_fixture]

METRIC_NAMES = [m.name for m in METRICS]

# -- shared value pools -------------------------------------------------------------
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
#: Wrong types and bad numbers any field may be given.
junk = st.one_of(
    scalars,
    st.sampled_from(
        [
            -1,
            0,
            1,
            2,
            3,
            7,
            2.5,
            -0.5,
            math.nan,
            math.inf,
            -math.inf,
            "ok",
            "oom",
            "cpu",
            "bf16",
            "matmul",
            (),
            (1,),
            (0, 1),
            [1, 2],
        ]
    ),
    st.lists(st.integers(-2, 8), max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=4), st.integers(-1, 3), max_size=2),
)


# -- 1. baseline files ------------------------------------------------------------------
finite = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False)
valid_metrics = st.dictionaries(
    st.sampled_from(METRIC_NAMES),
    st.one_of(
        finite,
        st.integers(0, 10**9),
        st.fixed_dictionaries({"mean": finite, "std": finite, "n": st.integers(1, 50)}),
    ),
    max_size=4,
)
valid_tolerances = st.dictionaries(
    st.sampled_from(METRIC_NAMES), st.floats(min_value=0, max_value=0.99, allow_nan=False), max_size=3
)
fingerprints = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


def _entries() -> st.SearchStrategy[Any]:
    """Arbitrary JSON, or a valid entry with one field broken and some left out: the
    broken field is what the inner checks must name."""
    odd_numbers = st.sampled_from([math.nan, math.inf, -math.inf, True, False, None, "1.0", -1])
    metric_value = st.one_of(
        odd_numbers,
        st.fixed_dictionaries({"mean": odd_numbers}),
        st.fixed_dictionaries({"mean": json_values}, optional={"std": json_values, "n": json_values}),
        json_values,
    )
    names = st.sampled_from(METRIC_NAMES) | st.text(max_size=5)
    broken = {
        "expected": json_values,
        "metrics": st.dictionaries(names, metric_value, min_size=1, max_size=2) | json_values,
        "tolerances": st.dictionaries(names, odd_numbers | json_values, min_size=1, max_size=2) | json_values,
        "fingerprint": st.sampled_from([[1], [[1, 2]], "x", 3, None, {}]) | json_values,
        "note": json_values,
        "recorded_at": json_values,
    }

    @st.composite
    def near_valid(draw: st.DrawFn) -> dict[str, Any]:
        entry = {
            "expected": draw(st.sampled_from(OUTCOMES)),
            "metrics": draw(valid_metrics),
            "tolerances": draw(valid_tolerances),
            "fingerprint": draw(fingerprints),
            "note": draw(st.text(max_size=5)),
        }
        for key in draw(st.lists(st.sampled_from(sorted(entry)), max_size=2)):
            entry.pop(key, None)
        field = draw(st.sampled_from(sorted(broken)))
        entry[field] = draw(broken[field])
        return entry

    return st.one_of(json_values, near_valid())


documents = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "schema_version": st.one_of(st.just(1), json_values),
            "scenarios": st.one_of(st.dictionaries(st.text(max_size=8), _entries(), max_size=3), json_values),
            "profile": json_values,
            "group": json_values,
        },
    ),
    # Mostly valid: the right header, so the entries are what is judged.
    st.builds(
        lambda scenarios: {"schema_version": 1, "scenarios": scenarios},
        st.dictionaries(st.text(max_size=8), _entries(), max_size=3),
    ),
)
raw_contents = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")),
    documents.map(lambda d: json.dumps(d)[:-1].encode()),  # truncated JSON
)


def _assert_names_file(exc: BaselineError, path: Path) -> None:
    message = str(exc)
    assert str(path) in message, message
    assert "restore the file from version control" in message or "rerun" in message, message


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_loaded(entries: Mapping[str, BaselineEntry]) -> None:
    """What every consumer relies on in an entry that loaded."""
    for entry in entries.values():
        assert entry.expected in OUTCOMES
        assert isinstance(entry.fingerprint, Mapping)
        for metric in entry.metrics:
            assert math.isfinite(entry.value(metric) or 0.0), (metric, entry.metrics[metric])
        for tol in entry.tolerances.values():
            assert _finite_number(tol) and 0 <= tol < 1


def _load_or_refuse(path: Path) -> dict[str, BaselineEntry] | None:
    try:
        entries = load_group_file(path)
    except BaselineError as exc:
        _assert_names_file(exc, path)
        return None
    _check_loaded(entries)
    return entries


@settings(FAST, max_examples=200)
@given(doc=documents)
def test_any_json_document_loads_or_is_refused_naming_the_file(doc: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = BaselineStore(Path(tmp), "cpu")
        path = store.path("group")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc), encoding="utf-8")
        entries = _load_or_refuse(path)
        if entries is None:
            before = path.read_bytes()
            with pytest.raises(BaselineError) as refused:
                store.record("group", "g.new", "ok", {"samples_per_s": 1.0}, {})
            _assert_names_file(refused.value, path)
            assert path.read_bytes() == before, "a refused file must never be rewritten"
            return
        # A file that loads can be updated, and the update keeps every other entry.
        store.record("group", "g.new-one", "ok", {"samples_per_s": 1.0}, {"torch": "x"})
        again = load_group_file(path)
        assert set(again) == set(entries) | {"g.new-one"}
        for key, entry in entries.items():
            if key != "g.new-one":
                assert json.dumps(again[key].to_json(), sort_keys=True) == json.dumps(entry.to_json(), sort_keys=True)


@FAST
@given(content=raw_contents)
def test_raw_bytes_load_or_are_refused_naming_the_file(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "group.json"
        path.write_bytes(content)
        _load_or_refuse(path)


scenario_ids = st.from_regex(r"[a-z0-9][a-z0-9_\-]{0,6}\.[a-z0-9][a-z0-9_\-]{0,6}", fullmatch=True)


@settings(FAST, max_examples=80)
@given(
    records=st.lists(
        st.tuples(scenario_ids, st.sampled_from(OUTCOMES), valid_metrics, fingerprints, valid_tolerances),
        min_size=1,
        max_size=4,
    )
)
def test_valid_entries_round_trip_through_record_and_load(
    records: list[tuple[str, str, dict[str, Any], dict[str, Any], dict[str, float]]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = BaselineStore(Path(tmp), "cpu")
        expected: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, float]]] = {}
        for scenario_id, outcome, metrics, fingerprint, tolerances in records:
            store.record("grp", scenario_id, outcome, metrics, fingerprint, tolerances)
            old_tolerances = expected.get(scenario_id, ("", {}, {}, {}))[3]
            expected[scenario_id] = (outcome, metrics, fingerprint, {**old_tolerances, **tolerances})
        loaded = load_group_file(store.path("grp"))
        assert set(loaded) == set(expected)
        for scenario_id, (outcome, metrics, fingerprint, tolerances) in expected.items():
            entry = loaded[scenario_id]
            assert entry.expected == outcome
            assert _same_json(entry.metrics, metrics)
            assert _same_json(entry.fingerprint, fingerprint)
            assert _same_json(entry.tolerances, tolerances)
            assert "recorded_at" in entry.extra


def _same_json(a: Any, b: Any) -> bool:
    return json.dumps(dict(a), sort_keys=True) == json.dumps(dict(b), sort_keys=True)


# -- 2. scenario specs ----------------------------------------------------------------
TINY = ModelSpec("bert", layers=2, hidden=32, heads=2, vocab=512, max_positions=64)
GPT = ModelSpec("megatron_gpt", layers=4, hidden=64, heads=4, vocab=512, max_positions=64)

#: A valid spec of each kind, and values to try per field (good and bad alike).
KINDS: dict[type[BaseScenario], dict[str, Any]] = {
    Scenario: {"model": TINY, "world_size": 2, "micro_batch": 2, "global_batch": 4, "seq_len": 32, "steps": 3},
    Microbench: {"op": "matmul", "dtype": "fp32", "shape": (64, 64, 64)},
    DeviceCopy: {"size_bytes": 4096},
    Collective: {"world_size": 2, "size_bytes": 1024},
    TrainerScenario: {
        "model": TINY,
        "per_device_batch": 2,
        "grad_accum": 1,
        "train_samples": 16,
        "epochs": 1,
        "seq_len": 32,
    },
}
strategy_options = st.one_of(
    st.dictionaries(
        st.sampled_from(
            [
                "stage",
                "tp",
                "pp",
                "schedule",
                "microbatches",
                "virtual_stages",
                "offload_optimizer",
                "param_persistence_threshold",
                "reduce_buffer_size",
                "bogus",
            ]
        )
        | st.integers(0, 2),
        st.one_of(junk, st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"])),
        max_size=3,
    ),
    junk,
)
#: Edge numbers, tried first for numeric fields: what a typo or a unit slip gives.
numbers = st.one_of(
    st.sampled_from([0, -1, 1, 2, 4, 64, 0.5, 1.5, math.nan, math.inf, -math.inf, True, None, "2"]), junk
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "group": st.one_of(junk, st.sampled_from(["g", "Bad Name", "a.b", ""])),
    "name": st.one_of(junk, st.sampled_from(["n", "x-1", "UPPER"])),
    "world_size": numbers,
    "world_sizes": st.one_of(numbers, st.lists(numbers, max_size=3).map(tuple)),
    "env": st.one_of(junk, st.sampled_from(["ort", "Not Valid", "current"])),
    "nodes": numbers,
    "warmup_steps": numbers,
    "max_warmup_steps": numbers,
    "steps": numbers,
    "tolerances": st.one_of(junk, st.dictionaries(st.sampled_from(METRIC_NAMES) | st.text(max_size=4), numbers)),
    "max_imbalance": st.one_of(junk, st.dictionaries(st.sampled_from(METRIC_NAMES) | st.text(max_size=4), numbers)),
    "expect": st.one_of(junk, st.dictionaries(st.sampled_from(["cpu", "cuda"]), junk, max_size=2)),
    "only_on": st.one_of(junk, st.lists(st.sampled_from(["cpu", "cuda", 1]), max_size=2).map(tuple)),
    "timeout_s": numbers,
    "model": st.one_of(junk, st.sampled_from([TINY, GPT])),
    "precision": st.one_of(junk, st.sampled_from(["fp32", "fp16", "bf16", "fp64"])),
    "strategy": st.one_of(
        junk,
        st.sampled_from(["ddp", "deepspeed_zero", "tp_pp", "megatron_core", "fairscale_sdp", "fsdp2", "nope"]),
        st.sampled_from(["zz_no_such_package:Strategy", "perfsuite.no_such_module:X", ":", "a:"]),
    ),
    "strategy_options": strategy_options,
    "micro_batch": numbers,
    "global_batch": numbers,
    "seq_len": numbers,
    "lr": numbers,
    "graph": st.one_of(junk, st.sampled_from(["eager", "compile", "ort"])),
    "op": st.one_of(junk, st.sampled_from(["matmul", "matmul_best", "vector_mul", "layer", "all_gather"])),
    "dtype": st.one_of(junk, st.sampled_from(["fp32", "tf32", "fp16", "fp8", "bf16"])),
    "shape": st.one_of(numbers, st.lists(numbers, max_size=5).map(tuple)),
    "iterations": numbers,
    "layer": st.one_of(junk, st.sampled_from(["bert", "t5_decoder"])),
    "layer_pass": st.one_of(junk, st.sampled_from(["fwd", "fwd_bwd"])),
    "search": st.one_of(junk, st.lists(junk, max_size=2).map(tuple)),
    "size_bytes": numbers,
    "per_device_batch": numbers,
    "grad_accum": numbers,
    "train_samples": numbers,
    "eval_samples": numbers,
    "epochs": numbers,
}


def _init_fields(kind: type[BaseScenario]) -> list[str]:
    return [f.name for f in dataclasses.fields(kind) if f.init and f.name in FIELD_VALUES]


def _overrides(kind: type[BaseScenario]) -> st.SearchStrategy[dict[str, Any]]:
    names = st.sampled_from(_init_fields(kind))
    chosen = st.lists(names, min_size=1, max_size=2, unique=True)
    return st.just({}) | chosen.flatmap(lambda c: st.fixed_dictionaries({n: FIELD_VALUES[n] for n in c}))


def _variants(kind: type[BaseScenario]) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(["cpu", "cuda", "cuda-32gb"]) | junk.filter(lambda k: isinstance(k, (str, int)))
    return st.one_of(junk, st.dictionaries(keys, st.one_of(junk, _overrides(kind)), max_size=2))


@st.composite
def specs(draw: st.DrawFn) -> tuple[type[BaseScenario], dict[str, Any]]:
    kind = draw(st.sampled_from(list(KINDS)))
    kwargs = {"group": "g", "name": "n", **KINDS[kind], **draw(_overrides(kind))}
    if draw(st.booleans()):
        kwargs["variants"] = draw(_variants(kind))
    return kind, kwargs


def _field_named(message: str) -> str:
    """The field a ScenarioError names (``variants['cpu']`` -> ``variants``)."""
    found = re.match(r"scenario .*?: field ['\"]([^'\"\[]+)", message, re.S)
    return found.group(1) if found else ""


def _named_fields(kind: type[BaseScenario]) -> set[str]:
    return {f.name for f in dataclasses.fields(kind)}


def _check_refusal(kind: type[BaseScenario], kwargs: dict[str, Any], exc: ScenarioError) -> None:
    message = str(exc)
    owner = f"{kwargs['group']}.{kwargs['name']}"
    assert message.startswith(f"scenario {owner!r}: field "), message
    assert _field_named(message) in _named_fields(kind), message


def _check_usable(scenario: BaseScenario) -> None:
    """What the launch, report and baselines read of a scenario that was accepted."""
    json.dumps(scenario.to_config(), allow_nan=False)
    scenario.rank_spec()
    assert all(math.isfinite(v) and v > 0 for v in scenario.step_work().values())
    for value in (scenario.timeout_s, *scenario.tolerances.values(), *scenario.max_imbalance.values()):
        assert value is None or math.isfinite(value)
    for key in scenario.variants:
        _check_usable(scenario.resolve((key,)))
    for size in scenario.world_sizes:
        scenario.at_world_size(size).validate()
    scenario.fit(1)


@settings(FAST, max_examples=600)
@given(spec=specs())
def test_a_scenario_spec_is_accepted_or_refused_naming_scenario_and_field(
    spec: tuple[type[BaseScenario], dict[str, Any]],
) -> None:
    kind, kwargs = spec
    try:
        scenario = kind(**kwargs)
    except ScenarioError as exc:
        _check_refusal(kind, kwargs, exc)
        return
    _check_usable(scenario)


@FAST
@given(
    kwargs=st.fixed_dictionaries(
        {"family": st.one_of(junk, st.sampled_from(["bert", "gpt2", "megatron_gpt", "llama"]))},
        optional=dict.fromkeys(("layers", "hidden", "heads", "vocab", "ffn", "max_positions", "dropout"), junk),
    )
)
def test_a_model_spec_is_accepted_or_refused_naming_the_field(kwargs: dict[str, Any]) -> None:
    kwargs = {"layers": 2, "hidden": 32, "heads": 2, **kwargs}
    try:
        model = ModelSpec(**kwargs)
    except ScenarioError as exc:
        owner = f"model {kwargs['family']}"
        assert str(exc).startswith(f"scenario {owner!r}: "), str(exc)
        assert _field_named(str(exc)) in {f.name for f in dataclasses.fields(ModelSpec)}, str(exc)
        return
    assert model.ffn_size >= 1 and model.objective


def test_the_scenario_properties_reach_both_outcomes() -> None:
    """The generators are not all-invalid: valid specs of every kind construct."""
    for kind, kwargs in KINDS.items():
        _check_usable(kind(group="g", name="n", **kwargs))


# -- 3. flag values -------------------------------------------------------------------
flag_text = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "nan", "-inf", "1e400", " 3 ", "1_0", "0x10", "abc", "1,2", "2048x2", "0x0", "x"]),
    # argv holds neither NUL nor lone surrogates.
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
)
env_names = st.one_of(
    st.sampled_from([CURRENT, "ort", "base", "cand", ""]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6),
)


@FAST
@given(values=st.lists(st.one_of(flag_text, st.tuples(env_names, flag_text).map("=".join)), max_size=3))
def test_perf_env_values_parse_or_are_refused_naming_the_flag(values: list[str]) -> None:
    try:
        envs = parse_envs(values)
    except EnvError as exc:
        assert "--perf-env" in str(exc)
        return
    assert CURRENT in envs and all(env.python for env in envs.values())


@FAST
@given(value=st.one_of(st.none(), flag_text, st.lists(env_names, max_size=3).map(",".join)))
def test_perf_ab_values_parse_or_are_refused_naming_the_flag(value: str | None) -> None:
    envs = parse_envs(["base=/usr/bin/python3", "cand=/usr/bin/python3"])
    try:
        pair = parse_ab(value, envs)
    except EnvError as exc:
        assert "--perf-ab" in str(exc)
        return
    assert pair is None or (pair[0] in envs and pair[1] in envs and pair[0] != pair[1])


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int_at_least(minimum: int, maximum: float = math.inf) -> Callable[[str], bool]:
    return lambda text: (n := _int(text)) is not None and minimum <= n <= maximum


def _finite_in(low: float, high: float = math.inf, high_open: bool = False) -> Callable[[str], bool]:
    def valid(text: str) -> bool:
        x = _float(text)
        return x is not None and math.isfinite(x) and low <= x and (x < high if high_open else x <= high)

    return valid


AB = ("--perf-ab=base,cand", "--perf-env=base=/usr/bin/python3", "--perf-env=cand=/usr/bin/python3")
#: Flag -> (flags it needs beside it, which values are valid).
FLAGS: dict[str, tuple[tuple[str, ...], Callable[[str], bool]]] = {
    "--perf-timeout": ((), lambda t: _finite_in(0)(t) and float(t) > 0),
    "--perf-repeats": ((), _int_at_least(1)),
    "--perf-confirm": ((), _int_at_least(0)),
    "--perf-device-wait": ((), _finite_in(0)),
    "--perf-inject-slowdown": ((), _finite_in(0)),
    "--perf-nnodes": ((), _int_at_least(1, 1)),  # > 1 needs another launcher
    "--perf-nproc-per-node": ((), _int_at_least(1)),
    "--perf-local-agents": ((), _int_at_least(1)),
    "--perf-max-batch-limit": (("--perf-find-max-batch",), _int_at_least(1)),
    "--perf-max-batch-start": (("--perf-find-max-batch",), _int_at_least(1, 4096)),
    "--perf-min-effect": (AB, lambda t: _finite_in(0, 10, high_open=True)(t) and float(t) > 0),
    "--perf-ab-max-pairs": (AB, _int_at_least(2, 200)),
    "--perf-ab-budget": (AB, lambda t: _finite_in(0)(t) and float(t) > 0),
    "--perf-ab-inject-slowdown": (AB, _finite_in(0)),
    "--perf-gpu-hour-price": (("--perf-profile=cpu",), _finite_in(0)),
}
#: Free-form flags: any value is accepted or refused by name, no rule to restate.
FREE_FLAGS = ("--perf-job", "--perf-env", "--perf-ab", "--perf-profile", "--perf-launcher", "--perf-gpu-busy")


def _configure(pytester: pytest.Pytester, args: list[str]) -> None:
    """pytest's option parsing and perfsuite's pytest_configure checks, in process."""
    config = pytester.parseconfig(*args)
    plugin.pytest_configure(config)


@settings(FAST, max_examples=80, suppress_health_check=FIXTURE)
@given(flag=st.sampled_from(sorted(FLAGS)), value=flag_text)
def test_numeric_flags_are_accepted_exactly_when_valid(pytester: pytest.Pytester, flag: str, value: str) -> None:
    needs, valid = FLAGS[flag]
    args = [*needs, f"{flag}={value}"]
    if valid(value):
        _configure(pytester, args)
        return
    with pytest.raises(pytest.UsageError) as refused:
        _configure(pytester, args)
    assert flag in str(refused.value), str(refused.value)


@settings(FAST, max_examples=40, suppress_health_check=FIXTURE)
@given(flag=st.sampled_from(FREE_FLAGS), value=st.one_of(flag_text, st.tuples(env_names, flag_text).map("=".join)))
def test_free_form_flags_are_accepted_or_refused_by_name(pytester: pytest.Pytester, flag: str, value: str) -> None:
    args = [f"{flag}={value}"]
    try:
        _configure(pytester, args)
    except pytest.UsageError as exc:
        assert flag in str(exc), str(exc)


@pytest.mark.parametrize(
    ("endpoint", "accepted"),
    [
        ("127.0.0.1:29400", True),
        ("gpu07:29400", True),
        ("[::1]:29500", True),
        ("127.0.0.1", False),
        (":29400", False),
        ("gpu07:0", False),
        ("gpu07:65536", False),
        ("gpu07:port", False),
        ("::1:29400", False),
        ("[]:29400", False),
    ],
)
def test_a_rendezvous_endpoint_is_host_and_port(pytester: pytest.Pytester, endpoint: str, accepted: bool) -> None:
    args = ["--perf-launcher=torchrun", f"--perf-rdzv-endpoint={endpoint}"]
    if accepted:
        _configure(pytester, args)
        return
    with pytest.raises(pytest.UsageError, match="--perf-rdzv-endpoint takes HOST:PORT"):
        _configure(pytester, args)


@SLOW
@given(flag=st.sampled_from([*sorted(FLAGS), "--perf-job"]), value=flag_text)
def test_a_bad_flag_ends_pytest_with_a_usage_error_not_a_traceback(
    pytester: pytest.Pytester, flag: str, value: str
) -> None:
    needs = FLAGS[flag][0] if flag in FLAGS else ()
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", *needs, f"{flag}={value}")
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    if result.ret == pytest.ExitCode.USAGE_ERROR:
        assert flag in result.stderr.str(), output
    else:
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, output
        assert flag not in FLAGS or FLAGS[flag][1](value)
