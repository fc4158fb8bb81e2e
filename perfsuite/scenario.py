"""Scenario specs: frozen, typed, validated descriptions of one benchmark run.

A :class:`Scenario` is declared once with its seed (published) shape and may carry
per-profile *variants* (``{"cpu": {...}}``) that shrink it for small hardware. The
id (``group.name``) never changes with the profile: it is the pytest id and the
baseline key, so a ``cpu`` baseline and an ``h100`` baseline of the same id measure
the same experiment at different scales.

This module must stay importable without torch: it runs in the pytest process.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from perfsuite.layout import LayoutError, ParallelLayout

Precision = Literal["fp32", "fp16", "bf16"]
Outcome = Literal["ok", "oom"]
ModelFamily = Literal["bert", "gpt2", "megatron_gpt"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
OUTCOMES: tuple[str, ...] = get_args(Outcome)
MODEL_FAMILIES: tuple[str, ...] = get_args(ModelFamily)

#: Metrics a baseline may hold, with the direction that counts as better.
METRIC_DIRECTIONS: Mapping[str, Literal["higher", "lower"]] = MappingProxyType(
    {
        "samples_per_s": "higher",
        "peak_mem_mib": "lower",
        "model_state_bytes_per_rank": "lower",
    }
)

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class ScenarioError(ValueError):
    """A scenario spec is invalid; the message names the scenario and the field."""


def _fail(owner: str, fieldname: str, problem: str) -> ScenarioError:
    return ScenarioError(f"scenario {owner!r}: field {fieldname!r} {problem}")


def _check_int(owner: str, name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(owner, name, f"must be an int >= {minimum}, got {value!r}")


def _check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise _fail(owner, name, f"must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a transformer built from a transformers config with random weights."""

    family: ModelFamily
    layers: int
    hidden: int
    heads: int
    vocab: int = 30522
    ffn: int | None = None  # defaults to 4 * hidden, as in BERT/GPT
    max_positions: int = 512

    def __post_init__(self) -> None:
        owner = f"model {self.family}"
        _check_choice(owner, "family", self.family, MODEL_FAMILIES)
        for name in ("layers", "hidden", "heads", "vocab", "max_positions"):
            _check_int(owner, name, getattr(self, name), 1)
        if self.ffn is not None:
            _check_int(owner, "ffn", self.ffn, 1)
        if self.hidden % self.heads:
            raise _fail(owner, "heads", f"must divide hidden={self.hidden}, got {self.heads}")

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario: what to train, how, and what outcome to expect.

    ``variants`` maps a profile name (``"cpu"``, ``"cuda-32gb"``) or device kind
    (``"cpu"``/``"cuda"``) to field overrides; :meth:`resolve` applies the most
    specific one. ``expect`` maps the same keys to ``"ok"`` or ``"oom"``.
    """

    group: str
    name: str
    model: ModelSpec
    precision: Precision = "fp32"
    strategy: str = "ddp"
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    world_size: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    seq_len: int = 128
    warmup_steps: int = 3  # minimum warmup; more run until step times settle
    max_warmup_steps: int | None = None  # default: 3 x warmup_steps
    steps: int = 10
    lr: float = 1e-4
    tolerances: Mapping[str, float] = field(default_factory=dict)
    #: Limits on max/min across ranks, e.g. {"peak_mem_mib": 1.5}: a straggler
    #: or a lopsided pipeline stage fails the scenario.
    max_imbalance: Mapping[str, float] = field(default_factory=dict)
    expect: Mapping[str, Outcome] = field(default_factory=dict)
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Variant keys (profile names or "cpu"/"cuda") this scenario runs on; empty
    #: means everywhere. Elsewhere it skips without starting workers.
    only_on: tuple[str, ...] = ()
    timeout_s: float | None = None
    reference: str = ""  # which published row this reproduces

    def __post_init__(self) -> None:
        for name in ("strategy_options", "tolerances", "max_imbalance", "expect", "variants"):
            object.__setattr__(self, name, _frozen_mapping(getattr(self, name)))
        self._validate()

    @property
    def id(self) -> str:
        """Stable id: the pytest parameter id and the baseline key."""
        return f"{self.group}.{self.name}"

    # -- validation ---------------------------------------------------------
    def _validate(self) -> None:
        owner = f"{self.group}.{self.name}"
        for name in ("group", "name"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise _fail(owner, name, "must be lowercase letters, digits, '_' or '-'")
        if not isinstance(self.model, ModelSpec):
            raise _fail(owner, "model", f"must be a ModelSpec, got {type(self.model).__name__}")
        _check_choice(owner, "precision", self.precision, PRECISIONS)
        for name in ("world_size", "micro_batch", "global_batch", "seq_len", "steps"):
            _check_int(owner, name, getattr(self, name), 1)
        _check_int(owner, "warmup_steps", self.warmup_steps, 0)
        if self.max_warmup_steps is not None:
            _check_int(owner, "max_warmup_steps", self.max_warmup_steps, self.warmup_steps)
        if self.steps < 2:
            raise _fail(owner, "steps", f"must be >= 2 to report a spread, got {self.steps}")
        self._validate_layout(owner)
        per_step = self.micro_batch * self.data_parallel_size
        if self.global_batch % per_step:
            raise _fail(
                owner,
                "global_batch",
                f"must be a multiple of micro_batch x data-parallel ranks = {per_step}, "
                f"got {self.global_batch}",
            )
        if self.seq_len > self.model.max_positions:
            raise _fail(owner, "seq_len", f"exceeds model.max_positions={self.model.max_positions}")
        if not isinstance(self.lr, (int, float)) or self.lr <= 0:
            raise _fail(owner, "lr", f"must be a positive number, got {self.lr!r}")
        for metric, tol in self.tolerances.items():
            if metric not in METRIC_DIRECTIONS:
                raise _fail(owner, "tolerances", f"names unknown metric {metric!r}")
            if not isinstance(tol, (int, float)) or not 0 <= tol < 1:
                raise _fail(owner, "tolerances", f"[{metric!r}] must be in [0, 1), got {tol!r}")
        for metric, limit in self.max_imbalance.items():
            if metric not in ("samples_per_s", "peak_mem_mib"):
                raise _fail(owner, "max_imbalance", f"names {metric!r}; use samples_per_s or peak_mem_mib")
            if not isinstance(limit, (int, float)) or limit < 1:
                raise _fail(owner, "max_imbalance", f"[{metric!r}] must be a ratio >= 1, got {limit!r}")
        for key, outcome in self.expect.items():
            if outcome not in OUTCOMES:
                raise _fail(owner, "expect", f"[{key!r}] must be one of {OUTCOMES}, got {outcome!r}")
        if self.timeout_s is not None and (
            not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0
        ):
            raise _fail(owner, "timeout_s", f"must be a positive number, got {self.timeout_s!r}")
        self._validate_strategy(owner)
        self._validate_variants(owner)

    def _validate_layout(self, owner: str) -> None:
        try:
            layout = self.layout
            if layout.pp > 1:
                layout.check_layers(self.model.layers)
            if layout.tp > 1:
                layout.check_heads(self.model.heads, self.model.hidden, self.model.vocab)
        except LayoutError as exc:
            raise _fail(owner, "strategy_options", f"describes an invalid layout: {exc}") from None
        if layout.pp > 1 and self.global_batch != self.micro_batch * layout.microbatches * layout.dp:
            raise _fail(
                owner,
                "global_batch",
                f"must be micro_batch x microbatches x dp = {self.micro_batch} x {layout.microbatches} "
                f"x {layout.dp} for a pipeline, got {self.global_batch}",
            )

    def _validate_strategy(self, owner: str) -> None:
        if not isinstance(self.strategy, str) or not self.strategy:
            raise _fail(owner, "strategy", "must be a non-empty string")
        if strategy_module(self.strategy) is None:
            raise _fail(
                owner,
                "strategy",
                f"{self.strategy!r} is neither a module in perfsuite.strategies nor an "
                "importable 'package.module:Class' path",
            )

    def _validate_variants(self, owner: str) -> None:
        allowed = {f.name for f in dataclasses.fields(self)} - {"group", "name", "variants"}
        for key, overrides in self.variants.items():
            unknown = set(overrides) - allowed
            if unknown:
                raise _fail(owner, f"variants[{key!r}]", f"overrides unknown fields {sorted(unknown)}")
            try:
                dataclasses.replace(self, variants={}, **overrides)
            except ScenarioError as exc:
                raise ScenarioError(f"{exc} (in variants[{key!r}])") from None

    # -- resolution ---------------------------------------------------------
    @property
    def layout(self) -> ParallelLayout:
        """dp x tp x pp of this scenario (raises LayoutError if it cannot run)."""
        return ParallelLayout.from_options(self.world_size, self.strategy_options)

    @property
    def data_parallel_size(self) -> int:
        """Ranks that hold a data-parallel replica (world / (tp * pp))."""
        return self.layout.dp

    @property
    def warmup_limit(self) -> int:
        return self.max_warmup_steps if self.max_warmup_steps is not None else 3 * self.warmup_steps

    @property
    def grad_accum(self) -> int:
        return self.global_batch // (self.micro_batch * self.data_parallel_size)

    def resolve(self, keys: tuple[str, ...]) -> Scenario:
        """This scenario as run on a profile whose variant keys are ``keys``.

        The first key that has a variant wins (profile name before device kind).
        """
        for key in keys:
            if key in self.variants:
                return dataclasses.replace(self, variants={}, **self.variants[key])
        return dataclasses.replace(self, variants={})

    def expected_outcome(self, keys: tuple[str, ...]) -> Outcome:
        for key in keys:
            if key in self.expect:
                return self.expect[key]
        return "ok"

    def to_config(self) -> dict[str, Any]:
        """The resolved scenario as plain JSON (results file and worker input)."""
        return {
            "id": self.id,
            "group": self.group,
            "name": self.name,
            "model": dataclasses.asdict(self.model),
            "precision": self.precision,
            "strategy": self.strategy,
            "strategy_options": dict(self.strategy_options),
            "world_size": self.world_size,
            "layout": {**dataclasses.asdict(self.layout), "bubble_fraction": self.layout.bubble_fraction()},
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "grad_accum": self.grad_accum,
            "seq_len": self.seq_len,
            "warmup_steps": self.warmup_steps,
            "max_warmup_steps": self.warmup_limit,
            "steps": self.steps,
            "lr": self.lr,
        }


def strategy_module(strategy: str) -> str | None:
    """Module that implements ``strategy``, if it can be found without importing it."""
    module = strategy.split(":", 1)[0] if ":" in strategy else f"perfsuite.strategies.{strategy}"
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return module if found is not None else None
