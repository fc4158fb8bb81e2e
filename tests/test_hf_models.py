"""Any transformers architecture as a scenario's model (issue 29): ``ModelSpec.hf`` builds
Llama-, Qwen2- and ViT-style models offline from a model type or a local config.json and
refuses at collection what it cannot build; Llama trains under DDP, FSDP2 and ZeRO-2 on cpu,
and ViT under DDP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CPU_PROFILE, interpreter_path, record_team, require, team_gate

from perfsuite.core import models
from perfsuite.core.models import ModelSpec
from perfsuite.core.protocol import COUNTED_FLOPS
from perfsuite.core.validation import ScenarioError

SHAPE = dict(layers=2, hidden=64, heads=4, vocab=512, ffn=128, max_positions=64)


def test_a_model_type_with_fields_is_the_config_the_ranks_build() -> None:
    spec = ModelSpec.hf("llama", **SHAPE, num_key_value_heads=2)
    assert (spec.family, spec.source, spec.task, spec.objective) == ("hf", "llama", "causal_lm", "causal_lm")
    assert spec.hf_config() == {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 512,
        "max_position_embeddings": 64,
        "intermediate_size": 128,
        "num_key_value_heads": 2,
    }
    assert hash(spec) == hash(ModelSpec.hf("llama", **SHAPE, num_key_value_heads=2))
    vit = ModelSpec.hf("vit", "image_classification", layers=2, hidden=64, heads=4, image_size=32, patch_size=8)
    assert vit.hf_config()["num_labels"] == 2 and vit.objective == "image_classification"


def test_a_local_config_json_gives_the_type_and_shape(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    fields = {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 512,
        "num_key_value_heads": 2,
        "transformers_version": "4.44.0",
        "torch_dtype": "bfloat16",
    }
    path.write_text(json.dumps(fields))
    spec = ModelSpec.hf(str(path), layers=1)  # a field given wins over the file's
    assert (spec.source, spec.layers, spec.hidden, spec.vocab) == ("qwen2", 1, 64, 512)
    assert spec.config == {"num_key_value_heads": 2}  # no version or dtype pinned from the file


def test_a_gpt2_style_config_json_gives_its_shape_under_its_own_key_names(tmp_path: Path) -> None:
    # GPT-2 stores the shape as n_layer, n_embd, n_head, n_positions (its config's attribute_map).
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": 2,
                "n_embd": 64,
                "n_head": 4,
                "n_positions": 1024,
                "vocab_size": 512,
                "activation_function": "gelu_new",
            }
        )
    )
    spec = ModelSpec.hf(str(path))
    assert (spec.layers, spec.hidden, spec.heads, spec.max_positions, spec.vocab) == (2, 64, 4, 1024, 512)
    assert spec.config == {"activation_function": "gelu_new"}  # nothing left to contradict the shape


def test_a_config_json_whose_key_names_cannot_be_asked_fails_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read without its architecture's key names, a GPT-2 file would build another model than its own.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4}))
    monkeypatch.setattr(models, "hf_attribute_map", lambda model_type: None)  # the child failed
    with pytest.raises(ScenarioError, match="field 'source' could not be read: the child interpreter"):
        ModelSpec.hf(str(path))


def test_a_decoder_only_classifier_trains_a_batch_of_several_rows() -> None:
    # Llama defines no pad token; its classification head needs one to find each row's last token.
    torch = pytest.importorskip("torch")
    from perfsuite.rank.models.hf import auto

    llama = auto(ModelSpec.hf("llama", "classification", **SHAPE))
    out = llama(input_ids=torch.randint(1, 512, (4, 16)), labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    assert out.logits.shape == (4, 2) and llama.config.pad_token_id == 0
    # A pad token the user or the type gives is kept (RoBERTa's is 1).
    assert auto(ModelSpec.hf("llama", "classification", **SHAPE, pad_token_id=3)).config.pad_token_id == 3
    assert auto(ModelSpec.hf("roberta", "classification", **SHAPE)).config.pad_token_id == 1


@pytest.mark.parametrize(
    ("make", "field", "words"),
    [
        (lambda: ModelSpec.hf("meta-llama/Llama-3.2-1B", **SHAPE), "source", "would need the network"),
        (lambda: ModelSpec.hf("lama", **SHAPE), "source", "is no transformers model type here"),
        (lambda: ModelSpec.hf("llama", layers=2, hidden=64), "heads", "must be given"),
        (lambda: ModelSpec.hf("llama", "translation", **SHAPE), "task", "must be one of causal_lm"),
        (
            lambda: ModelSpec.hf("vit", **SHAPE),
            "task",
            "'causal_lm' has no vit model .* vit takes: image_classification",
        ),
        (lambda: ModelSpec.hf("llama", **SHAPE, rope_scaling=object()), "config", "must be plain JSON"),
        (lambda: ModelSpec.hf("/nowhere/config.json", **SHAPE), "source", "cannot be read as a config.json"),
        (lambda: ModelSpec("bert", 2, 64, 2, task="mlm"), "task", "is for family 'hf' only"),
    ],
)
def test_a_bad_model_reference_names_its_field(make, field: str, words: str) -> None:
    # Construction checks the form; the collection step asks transformers about the type and the task.
    with pytest.raises(ScenarioError, match=f"field '{field}'.*{words}"):
        error = make().probe(interpreter_path())
        if error is not None:
            raise error


HF_MODULE = """
from perfsuite import ModelSpec, Scenario, parametrize

LLAMA = ModelSpec.hf("llama", layers=2, hidden=64, heads=4, vocab=512, ffn=128, max_positions=64,
                     num_key_value_heads=2)
VIT = ModelSpec.hf("vit", "image_classification", layers=2, hidden=64, heads=4, ffn=128,
                   image_size=32, patch_size=8)
SHAPE = dict(world_size=2, micro_batch=4, global_batch=8, seq_len=32, warmup_steps=1, steps=4)
SCENARIOS = [
    Scenario("team", "llama_ddp", LLAMA, strategy="ddp", **SHAPE),
    Scenario("team", "llama_fsdp2", LLAMA, strategy="fsdp2", **SHAPE),
    Scenario("team", "llama_zero2", LLAMA, strategy="deepspeed_zero", strategy_options={"stage": 2}, **SHAPE),
    Scenario("team", "vit_ddp", VIT, strategy="ddp", **SHAPE),
]

@parametrize(SCENARIOS)
def test_team(perf, scenario):
    perf.check(scenario)
"""


def test_transformers_architectures_train_under_ddp_fsdp2_and_zero2_and_a_slowdown_fails(
    pytester: pytest.Pytester,
) -> None:
    require("deepspeed")
    results = record_team(pytester, HF_MODULE, passed=4)
    assert {r["verdict"] for r in results.values()} == {"recorded"}
    assert results["team.llama_ddp"]["config"]["model"]["source"] == "llama"
    # No FLOP formula fits these models: rank 0 counted a step's FLOPs, which the MFU and ceiling figures use.
    counted = {k.split(".")[1]: r["metrics"]["detail"].get(COUNTED_FLOPS) for k, r in results.items()}
    assert all(counted.values()), counted
    assert counted["llama_fsdp2"] == pytest.approx(counted["llama_ddp"], rel=0.01)  # same model, same micro-batch
    # Sharding engines hold less model state per rank than DDP's whole replica.
    state = {k.split(".")[1]: r["metrics"]["model_state_bytes_per_rank"] for k, r in results.items()}
    assert state["llama_fsdp2"] < state["llama_ddp"] and state["llama_zero2"] < state["llama_ddp"]
    slowed = team_gate(
        pytester, "-k", "llama_ddp", "--perf-inject-slowdown=300", "--perf-confirm=0", "--perf-op-profiles=off"
    )
    slowed.assert_outcomes(failed=1)
    slowed.stdout.fnmatch_lines(["*team.llama_ddp: regression: samples_per_s*"])


def test_a_hub_name_fails_collection_naming_the_field(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_team="""
        from perfsuite import ModelSpec, Scenario, parametrize
        SCENARIOS = [Scenario("team", "x", ModelSpec.hf("Qwen/Qwen2.5-0.5B", layers=2, hidden=64, heads=4),
                              world_size=2, micro_batch=2, global_batch=4, seq_len=16)]
        @parametrize(SCENARIOS)
        def test_team(perf, scenario):
            perf.check(scenario)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        ["*field 'source' names the Hub model 'Qwen/Qwen2.5-0.5B', which would need the network*"]
    )


def test_transformers_answers_are_kept_per_installed_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's answer about transformers is kept: a later run (its lru caches empty) asks no child,
    and another transformers version asks again."""
    from perfsuite.core.models import probe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    probe.hf_attribute_map.cache_clear()
    first = probe.hf_attribute_map("gpt2")
    assert first is not None and first["hidden_size"] == "n_embd"
    assert len(list((tmp_path / "perfsuite" / "probes").glob("*.json"))) == 1

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kept answer started a child")

    probe.hf_attribute_map.cache_clear()
    with monkeypatch.context() as patched:
        patched.setattr(probe.subprocess, "run", no_child)
        assert probe.hf_attribute_map("gpt2") == first
    probe.hf_attribute_map.cache_clear()
    monkeypatch.setattr(probe.importlib.metadata, "version", lambda name: "0.0.1")
    assert probe.hf_attribute_map("gpt2") == first  # asked again: a second answer is kept
    assert len(list((tmp_path / "perfsuite" / "probes").glob("*.json"))) == 2
    probe.hf_attribute_map.cache_clear()
