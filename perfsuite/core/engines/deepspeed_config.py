"""A team's own DeepSpeed config in a scenario (``strategy_options.config``), checked torch-free.

The config runs as given, except for what perfsuite owns: the batch keys come from the
scenario's ``micro_batch`` and ``global_batch`` and the precision from its ``precision``. A
config that says the same is accepted; one that says otherwise is refused at collection,
naming the key, since it would measure another experiment than the scenario's id claims.

Its optimizer is the team's. DeepSpeed builds Adam, Lamb and Lion from C++/CUDA ops
(FusedAdam, DeepSpeedCPUAdam...) compiled at first use; where this machine cannot build the
one a config needs, the scenario skips with the reason and the alternative, asked of a child
interpreter (the pytest process never imports torch, which DeepSpeed does).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from perfsuite.core.engines.base import OptionError, RunShape

#: Config keys perfsuite sets from the scenario, with the scenario field each one comes from.
BATCH_KEYS: Mapping[str, str] = {
    "train_micro_batch_size_per_gpu": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "train_batch_size": "global_batch",
}
#: Config sections that switch a half precision on, and the scenario precision each means.
PRECISION_KEYS: Mapping[str, str] = {"fp16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
#: A value DeepSpeed's integrations (transformers' Trainer) fill in themselves.
AUTO = "auto"
#: The "auto" values transformers' Trainer fills (transformers.integrations.deepspeed,
#: HfTrainerDeepSpeedConfig), with where it takes each from. The ranks fill them through that same
#: class, from TrainingArguments' defaults and the scenario (rank/strategies/deepspeed_zero.py).
TRAINER_SOURCES: Mapping[str, str] = {
    "optimizer.params.lr": "TrainingArguments.learning_rate",
    "optimizer.params.betas": "adam_beta1, adam_beta2",
    "optimizer.params.eps": "adam_epsilon",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "0",
    "scheduler.params.warmup_max_lr": "learning_rate",
    "scheduler.params.warmup_num_steps": "warmup_steps",
    "scheduler.params.total_num_steps": "the run's steps",
    "gradient_clipping": "max_grad_norm",
    "zero_optimization.reduce_bucket_size": "hidden_size * hidden_size",
    "zero_optimization.stage3_prefetch_bucket_size": "0.9 * hidden_size * hidden_size",
    "zero_optimization.stage3_param_persistence_threshold": "10 * hidden_size",
}


def check_config_stage(config: Any, stage: int | None) -> int | None:
    """The ZeRO stage of ``config`` and option ``stage`` together (raises where they differ)."""
    if config is None:
        return stage
    if not isinstance(config, Mapping):
        raise OptionError(
            f"option 'config' must be a DeepSpeed config (a dict or its JSON file's path), got {config!r}"
        )
    zero = config.get("zero_optimization") or {}
    given = zero.get("stage") if isinstance(zero, Mapping) else None
    if given is None:
        return stage
    if stage is not None and stage != given:
        raise OptionError(
            f"option 'stage' is {stage} but its config's zero_optimization.stage is {given}: give the stage once"
        )
    return int(given)


def check_batch_keys(config: Mapping[str, Any], run: RunShape) -> None:
    """Refuse a config whose batch keys or precision contradict the scenario's."""
    for key, name in BATCH_KEYS.items():
        value, ours = config.get(key), getattr(run, name)
        if value is not None and value != AUTO and value != ours:
            raise OptionError(
                f"sets config key {key!r} to {value!r}, but the scenario's {name} makes it {ours}: perfsuite owns "
                f"the batch (drop the key, or set it to {ours})"
            )
    for key, precision in PRECISION_KEYS.items():
        section = config.get(key)
        enabled = section.get("enabled") if isinstance(section, Mapping) else None
        if enabled is True and precision != run.precision:
            raise OptionError(
                f"sets config key '{key}.enabled' to true, but the scenario's precision is {run.precision!r}: "
                f"perfsuite owns the precision (set the scenario's precision to {precision!r}, or drop the key)"
            )


def auto_keys(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose value is "auto", but for those perfsuite fills from the scenario (the
    batch keys, a precision section's ``enabled``)."""
    found = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found += auto_keys(value, f"{path}.")
        elif value == AUTO and path not in BATCH_KEYS and not (key == "enabled" and prefix[:-1] in PRECISION_KEYS):
            found.append(path)
    return found


def check_auto(config: Mapping[str, Any]) -> None:
    """Refuse "auto" values the ranks cannot fill, naming each: those transformers' Trainer does
    not fill either, and all of them where transformers or accelerate (which its DeepSpeed
    integration needs) is missing. DeepSpeed itself would refuse them inside a rank."""
    keys = auto_keys(config)
    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    unfilled = [key for key in keys if key not in TRAINER_SOURCES or missing]
    if not unfilled:
        return
    named = ", ".join(
        f"{key} (the Trainer uses {TRAINER_SOURCES[key]})" if key in TRAINER_SOURCES else key for key in unfilled
    )
    why = (
        f"{' and '.join(missing)} is not installed, so perfsuite cannot fill them as transformers' Trainer does"
        if missing
        else "transformers' Trainer does not fill those either"
    )
    raise OptionError(f'has "auto" for {named}: {why}; give each a value')


def optimizer_op(config: Mapping[str, Any]) -> str | None:
    """The DeepSpeed op builder the config's optimizer needs (None: a plain torch optimizer)."""
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, Mapping):
        return None
    kind = str(optimizer.get("type", "")).lower()
    params = optimizer.get("params") or {}
    zero = config.get("zero_optimization") or {}
    offload = zero.get("offload_optimizer") if isinstance(zero, Mapping) else None
    on_host = isinstance(offload, Mapping) and offload.get("device") in ("cpu", "nvme")
    if kind in ("adam", "adamw"):
        if isinstance(params, Mapping) and params.get("torch_adam"):
            return None
        return "CPUAdamBuilder" if on_host else "FusedAdamBuilder"
    if kind == "lamb":
        return "FusedLambBuilder"
    if kind == "lion":
        return "CPULionBuilder" if on_host else "FusedLionBuilder"
    if kind == "adagrad" and on_host:
        return "CPUAdagradBuilder"
    return None


def config_optimizer_problem(config: Mapping[str, Any], device: str) -> str | None:
    """Why the config's optimizer cannot be built on ``device`` here (None when it can)."""
    builder = optimizer_op(config)
    if builder is None:
        return None
    why = _op_problem(builder, device)
    if not why:
        return None
    kind = config["optimizer"].get("type")
    return (
        f"its DeepSpeed config's optimizer {kind!r} needs DeepSpeed's {builder} op, which cannot be built here "
        f'({why}); set "torch_adam": true in the optimizer\'s params to train with torch.optim.AdamW, or drop '
        "the config's optimizer and choose one with option 'optimizer'"
    )


#: The child's answer: "" or why the op builder cannot load on this machine.
_OP_CHECK = """
import json, os, shutil, sys
os.environ["DS_ACCELERATOR"] = sys.argv[2]
try:
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops
    builder = get_accelerator().create_op_builder(sys.argv[1])
except Exception as exc:
    print(json.dumps(f"DeepSpeed cannot be imported: {type(exc).__name__}: {exc}"))
    raise SystemExit
if builder is None:
    print(json.dumps(f"DeepSpeed's {sys.argv[2]} accelerator has no such op"))
elif installed_ops.get(builder.name):
    print(json.dumps(""))
elif not builder.is_compatible(verbose=False):
    print(json.dumps("DeepSpeed reports the op incompatible with this machine"))
elif not shutil.which(os.environ.get("CXX", "c++")):
    print(json.dumps(f"no C++ compiler: {os.environ.get('CXX', 'c++')} is not on PATH"))
elif not shutil.which("ninja"):
    print(json.dumps("ninja, which DeepSpeed's just-in-time builds use, is not installed"))
else:
    # Build it now, in this child without a memory cap, so a rank finds it in the extensions cache
    # instead of compiling it under its RLIMIT_DATA budget, where the build fails.
    try:
        builder.load(verbose=False)
    except Exception as exc:
        print(json.dumps(f"building it failed: {type(exc).__name__}: {str(exc)[-300:]}"))
    else:
        print(json.dumps(""))
"""


@functools.lru_cache(maxsize=16)
def _op_problem(builder: str, device: str) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _OP_CHECK, builder, device], capture_output=True, text=True, timeout=300, check=False
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, IndexError, ValueError):
        return "the child interpreter asking DeepSpeed failed"
    return str(answer)
