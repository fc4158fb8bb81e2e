"""A changed scenario is not judged against the old one's baseline (issue 26):
the baseline keeps the resolved definition and provenance; a changed one
fails as ``definition_changed``, naming the fields, and never passes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from perfsuite.judge import definition
from perfsuite.judge.compare import FAILING
from perfsuite.judge.coverage import Outcome, coverage_of
from tests.test_verdicts import SCENARIO, STEADY, record, session


def test_changes_name_each_field_with_old_and_new_values() -> None:
    old = {"model": {"family": "bert", "ffn": 512}, "precision": "fp16", "world_size": 2}
    new = {"model": {"family": "bert", "ffn": 2048}, "precision": "bf16", "world_size": 2, "nodes": 2}
    # nodes: a field only one side has comes from another perfsuite version, not from the scenario.
    assert definition.changes(old, new) == ["model.ffn 512 -> 2048", "precision 'fp16' -> 'bf16'"]
    assert definition.changes(old, old) == []


def test_a_key_added_to_a_models_config_or_an_engines_options_is_a_change() -> None:
    # Those keys are the user's: one more override (llama's num_key_value_heads) or engine option
    # changes the work, where a field only one side has elsewhere comes from a perfsuite version.
    old = {"model": {"family": "hf", "config": {"rope_theta": 1e4}}, "strategy_options": {"stage": 2}}
    new = {
        "model": {"family": "hf", "config": {"rope_theta": 1e4, "num_key_value_heads": 1}},
        "strategy_options": {"stage": 2, "offload_optimizer": True},
    }
    assert definition.changes(old, new) == [
        "model.config.num_key_value_heads (unset) -> 1",
        "strategy_options.offload_optimizer (unset) -> True",
    ]
    assert definition.changes(new, old)[0] == "model.config.num_key_value_heads 1 -> (unset)"
    assert definition.changes({"model": {"family": "hf"}}, new) == []  # recorded before configs were kept


def test_descriptions_and_step_counts_are_not_part_of_the_definition() -> None:
    config = SCENARIO.to_config()
    defined = definition.definition(config)
    assert {"model", "precision", "world_size", "micro_batch", "global_batch", "seq_len"} <= set(defined)
    assert not {"reference", "declared", "steps", "id", "name"} & set(defined)


def test_a_baseline_keeps_the_definition_and_where_it_comes_from(tmp_path: Path) -> None:
    record(tmp_path, STEADY)
    entry = json.loads((tmp_path / "baselines" / "cpu" / "g.json").read_text())["scenarios"]["g.s"]
    assert entry["definition"] == definition.definition(SCENARIO.to_config())
    assert entry["provenance"]["perfsuite"] and entry["provenance"]["commit"] is None  # tmp_path is no git checkout
    here = definition.provenance(Path(__file__).parent)
    assert len(here["commit"]) == 40  # this checkout's HEAD
    assert entry["recorded_at"]


def test_a_changed_scenario_fails_as_definition_changed_even_when_faster(tmp_path: Path) -> None:
    record(tmp_path, STEADY)
    wider = dataclasses.replace(SCENARIO, model=dataclasses.replace(SCENARIO.model, ffn=2048))
    perf, _ = session(tmp_path, [[t / 2 for t in STEADY]])  # twice as fast: still not a pass
    result = perf.run(wider)
    assert result.verdict == "definition_changed" and result.verdict in FAILING
    assert "model.ffn 32 -> 2048" in result.judgement.message
    assert "re-record it: pytest -k 'g.s' --perf-update-baselines" in result.judgement.message
    found = coverage_of([Outcome("g.s", result.verdict)])
    assert found.unjudged == {"definition_changed": ("g.s",)} and not found.ok
    # Recording again takes the new definition; then it is judged as usual.
    record(tmp_path, STEADY)
    perf, _ = session(tmp_path, [STEADY])
    assert perf.run(SCENARIO).verdict == "pass"
