"""What an engine declares about itself, readable without torch: its options (a
validated dataclass), the devices and parallel axes it supports, the model
families it can split, its pip extra and the packages whose versions matter.

The pytest process reads these specs at collection and before launching, so a
typo in ``strategy_options``, tensor parallelism on a data-parallel engine or a
CUDA-only engine on the ``cpu`` profile is refused (or skipped) with the reason
before any rank starts. The rank side builds the engine from ``implementation``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar, get_type_hints

from perfsuite.core.layout import SCHEDULES, ParallelLayout, Schedule
from perfsuite.core.models.probe import REFERENCE, check_callable
from perfsuite.core.protocol import Device, ProtocolError, decode_value

OptionsT = TypeVar("OptionsT", bound="EngineOptions")

#: Layout options and the parallel axis each one configures.
LAYOUT_AXIS = {"tp": "tp", "pp": "pp", "schedule": "pp", "microbatches": "pp", "virtual_stages": "pp"}


class OptionError(ValueError):
    """Invalid ``strategy_options`` for an engine; the message names the option
    and reads as a predicate ("has unknown option 'stag' ...")."""


#: Graph modes of a train scenario (``Scenario.graph``); an engine declares those it takes.
GRAPH_MODES = ("eager", "compile", "ort")

#: The named optimizers of ``strategy_options.optimizer``: the torch class and its keyword
#: arguments besides the learning rate. ``adamw`` is torch's default (a foreach kernel per step).
OPTIMIZERS: Mapping[str, tuple[str, Mapping[str, Any]]] = MappingProxyType(
    {
        "adamw": ("torch.optim:AdamW", MappingProxyType({})),
        "adamw_fused": ("torch.optim:AdamW", MappingProxyType({"fused": True})),
        "sgd": ("torch.optim:SGD", MappingProxyType({})),
    }
)


@dataclass(frozen=True)
class RunShape:
    """What an engine's own configuration must agree with: the scenario's batch and precision."""

    micro_batch: int
    grad_accum: int
    global_batch: int
    precision: str


@dataclass(frozen=True)
class EngineOptions:
    """Base of an engine's ``strategy_options``: one field per option.

    Subclasses add fields (with defaults, or without for required options) and
    cross-field checks in ``__post_init__`` raising :class:`OptionError`.
    """

    refused: ClassVar[Mapping[str, str]] = MappingProxyType({})
    """Options other engines take that this one refuses, with the reason."""

    @classmethod
    def parse(cls: type[OptionsT], engine: str, options: Mapping[str, Any]) -> OptionsT:
        """Options from a scenario's mapping: unknown names, missing required
        ones and values of the wrong type are refused with the valid set."""
        for name in options:
            if name in cls.refused:
                raise OptionError(f"sets {name!r}, which engine {engine!r} refuses: {cls.refused[name]}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        valid = ", ".join(fields) or "(none)"
        unknown = sorted(set(options) - set(fields))
        if unknown:
            names = ", ".join(repr(u) for u in unknown)
            raise OptionError(f"has unknown option {names} for engine {engine!r}; valid options: {valid}")
        missing = [n for n, f in fields.items() if n not in options and _required(f)]
        if missing:
            raise OptionError(f"lacks required option {', '.join(map(repr, missing))} of engine {engine!r}")
        hints = get_type_hints(cls)
        try:
            values = {k: decode_value(hints[k], v, f"option {k!r}") for k, v in options.items()}
            return cls(**values)
        except (ProtocolError, OptionError) as exc:
            raise OptionError(invalid_for(engine, str(exc))) from None

    def layout(self, world_size: int) -> ParallelLayout:
        """The parallel layout these options describe: data parallel only by default."""
        return ParallelLayout(dp=world_size)

    @classmethod
    def normalise(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as the scenario's definition keeps them (a file's content, not its path)."""
        return dict(options)

    @classmethod
    def rescaled(cls, options: Mapping[str, Any], run: RunShape) -> dict[str, Any]:
        """The options of the same experiment fitted to another world size (``run``: the new shape)."""
        return dict(options)

    def check_run(self, run: RunShape) -> None:
        """Raise OptionError where the options contradict the scenario's batch or precision."""

    def unavailable(self, device: str) -> str | None:
        """Why these options cannot run on ``device`` here (None if they can)."""
        return None

    def probe(self, rank_path: str) -> str | None:
        """What a child interpreter on ``rank_path`` (the ranks' PYTHONPATH) finds wrong with these
        options (None if nothing): the collection step's check (:mod:`perfsuite.plugin.collection`),
        never the constructor's, since a rank parses the same options."""
        return None


def invalid_for(engine: str, problem: str) -> str:
    """How ``strategy_options`` that ``engine`` cannot take are refused (``problem`` names the option)."""
    return f"is invalid for engine {engine!r}: {problem}"


def check_optimizer(name: str, factories: bool = True) -> None:
    """An ``optimizer`` option's form: a name of :data:`OPTIMIZERS` or a ``package.module:function``
    factory (which :func:`optimizer_problem` has a child interpreter import at collection: the pytest
    process never imports torch)."""
    if name in OPTIMIZERS:
        return
    if not (isinstance(name, str) and REFERENCE.match(name)):
        raise OptionError(
            f"option 'optimizer' must be one of {', '.join(OPTIMIZERS)} or a 'package.module:function' "
            f"factory, got {name!r}"
        )
    if not factories:
        raise OptionError(
            f"option 'optimizer' takes one of {', '.join(OPTIMIZERS)} here: this engine wraps an optimizer "
            f"class in its own sharded optimizer, so a factory {name!r} cannot be used"
        )


def optimizer_problem(name: str, rank_path: str) -> str | None:
    """What a child interpreter on ``rank_path`` finds wrong with a well-formed ``optimizer``
    option (None if nothing; a named optimizer needs no child)."""
    problem = None if name in OPTIMIZERS else check_callable(name, rank_path)
    return f"option 'optimizer' {problem}" if problem is not None else None


@dataclass(frozen=True)
class StepOptions(EngineOptions):
    """Options of an engine that builds its own training step from perfsuite's parts."""

    optimizer: str = "adamw"
    """``adamw`` (torch's AdamW, foreach: the default), ``adamw_fused``, ``sgd``, or the team's
    ``"package.module:function"``, called as ``function(params, lr)`` and returning a torch optimizer."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward (non-reentrant checkpointing)."""

    takes_factory: ClassVar[bool] = True
    """Whether ``optimizer`` may name a factory (False: the engine wraps an optimizer class)."""

    def __post_init__(self) -> None:
        check_optimizer(self.optimizer, self.takes_factory)

    def probe(self, rank_path: str) -> str | None:
        return optimizer_problem(self.optimizer, rank_path)


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@dataclass(frozen=True)
class NoOptions(EngineOptions):
    """An engine without options."""


@dataclass(frozen=True)
class ParallelOptions(EngineOptions):
    """The layout options of a tensor/pipeline-parallel engine (see
    :class:`perfsuite.core.layout.ParallelLayout`; dp is what tp x pp leaves)."""

    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule."""
    microbatches: int = 1
    """Pipeline micro-batches per step and data-parallel replica."""
    virtual_stages: int = 1
    """Stages per pipeline rank (interleaved schedules)."""

    def layout(self, world_size: int) -> ParallelLayout:
        return ParallelLayout.from_options(world_size, dataclasses.asdict(self))


@dataclass(frozen=True)
class MissingPackage:
    """A module an engine imports that this interpreter cannot find, and the extra that installs it.

    Data rather than a sentence, so a run can group its skipped rows by what to install and
    ``doctor`` can name them, without parsing the skip message.
    """

    module: str
    """The module that cannot be found (``megatron.core``)."""
    extra: str = ""
    """perfsuite's pip extra that installs it (``EngineSpec.extra``; "" when it has none)."""

    @property
    def needs(self) -> str:
        """What to install: ``perfsuite[megatron]``, or the module when no extra installs it."""
        return f"perfsuite[{self.extra}]" if self.extra else self.module

    @property
    def install(self) -> str:
        """The command that installs it."""
        return f"pip install '{self.needs}'" if self.extra else f"install {self.module}"

    def describe(self) -> str:
        """The skip reason of the engine's scenarios."""
        return f"{self.module} is not installed; install it with: {self.install}"


@dataclass(frozen=True)
class EngineSpec:
    """One engine: what ``Scenario.strategy`` names."""

    name: str
    """The value of ``Scenario.strategy``."""
    implementation: str
    """``module:Class`` of the rank-side Strategy (imports torch)."""
    options: type[EngineOptions] = NoOptions
    """Dataclass of its ``strategy_options``."""
    devices: tuple[Device, ...] = ("cpu", "cuda")
    """Device kinds it runs on; elsewhere its scenarios skip before launching."""
    why_not: Mapping[str, str] = field(default_factory=dict)
    """Why it cannot run on a device kind it lacks (the skip reason)."""
    axes: tuple[str, ...] = ("dp",)
    """Parallel axes it implements: dp, tp, pp."""
    schedules: tuple[Schedule, ...] = SCHEDULES
    """Pipeline schedules it runs (when it has pp)."""
    model_families: tuple[str, ...] = ()
    """Model families it can train; empty means any."""
    extra: str = ""
    """pip extra of perfsuite that installs it."""
    requires: tuple[str, ...] = ()
    """Modules it imports; one that cannot be found skips its scenarios before launch."""
    packages: tuple[str, ...] = ()
    """Distributions whose versions the fingerprint tracks for stack-change reports."""
    graphs: tuple[str, ...] = ("eager",)
    """Graph modes (``Scenario.graph``) it composes with."""
    why_not_graph: str = ""
    """Why it refuses the graph modes it lacks (the collection error)."""
    smoke_options: Mapping[str, Any] = field(default_factory=dict)
    """``strategy_options`` of ``perfsuite doctor``'s smoke run (required options need values)."""
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "why_not", MappingProxyType(dict(self.why_not)))

    def parse_options(self, options: Mapping[str, Any], engines_with: Mapping[str, list[str]]) -> EngineOptions:
        """Validated options; ``engines_with`` maps an axis to the engines that have it."""
        for key, value in options.items():
            axis = LAYOUT_AXIS.get(key)
            if axis is not None and axis not in self.axes:
                others = ", ".join(engines_with.get(axis, [])) or "none registered"
                raise OptionError(
                    f"sets {key}={value!r}, but engine {self.name!r} implements {' x '.join(self.axes)} "
                    f"parallelism only; engines with {axis} parallelism: {others}"
                )
        parsed = self.options.parse(self.name, options)
        self._check_schedule(parsed)
        return parsed

    def _check_schedule(self, options: EngineOptions) -> None:
        if isinstance(options, ParallelOptions) and options.pp > 1 and options.schedule not in self.schedules:
            raise OptionError(
                f"asks for schedule {options.schedule!r}, which engine {self.name!r} does not have; "
                f"use one of {', '.join(self.schedules)}"
            )

    def unavailable(self, device: str, options: EngineOptions | None = None) -> str | None:
        """Why this engine (with ``options``) cannot run here, before anything launches (None if it can)."""
        if device not in self.devices:
            return self.why_not.get(device) or f"engine {self.name} runs on {', '.join(self.devices)} only"
        missing = self.missing_package(device)
        if missing is not None:
            return missing.describe()
        return options.unavailable(device) if options is not None else None

    def missing_package(self, device: str) -> MissingPackage | None:
        """The first module it imports that cannot be found here: the reason :meth:`unavailable`
        gives exactly when this is not None (None too where ``device`` already rules it out)."""
        if device not in self.devices:
            return None
        for module in self.requires:
            if not _importable(module):
                return MissingPackage(module, self.extra)
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


class EngineRegistry:
    """Engines by name; a ``package.module:Class`` path names a user engine
    without options (register an EngineSpec to give it options)."""

    def __init__(self) -> None:
        self._specs: dict[str, EngineSpec] = {}

    def register(self, spec: EngineSpec) -> EngineSpec:
        known = self._specs.get(spec.name)
        if known is not None and known != spec:
            raise ValueError(f"engine {spec.name!r} is already registered with a different spec")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> EngineSpec:
        """The spec for ``name``; raises LookupError saying what is known."""
        if name in self._specs:
            return self._specs[name]
        module = name.split(":", 1)[0]
        if ":" in name and _importable(module):
            return EngineSpec(name=name, implementation=name, description="user engine")
        raise LookupError(
            f"{name!r} is neither a registered engine ({', '.join(self._specs)}) nor an importable "
            "'package.module:Class' path"
        )

    def with_axis(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for spec in self._specs.values():
            for axis in spec.axes:
                found.setdefault(axis, []).append(spec.name)
        return found

    def __iter__(self) -> Iterator[EngineSpec]:
        return iter(self._specs.values())


ENGINES = EngineRegistry()
