"""What crosses the process boundary: the job a rank receives and the report it
returns, as typed dataclasses with a strict JSON codec.

Both sides import this module and nothing else to talk to each other: the
pytest process writes a :class:`RankJob` (``job.json``) and reads one
:class:`RankReport` per rank (``rankN.json``); each rank does the opposite.
Decoding is strict (an unknown or missing field is an error that names it), so
the two sides cannot drift apart silently. Torch-free.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from perfsuite.core.files import atomic_write_json
from perfsuite.core.opprofile import OpProfile
from perfsuite.core.workcount import WorkCount

#: Environment variable naming the pytest process that launched a run
#: (``host:pid:create_time``): ranks on its host exit when it is gone.
LAUNCHER_VAR = "PERFSUITE_LAUNCHER"

#: Each rank names its process ``perfsuite-r<RANK>`` (``ps -o comm``, ``top``,
#: psutil's ``name()``): a rank forked from its agent shows the agent's command
#: line and environment, so the name is how a person or a test tells ranks apart.
RANK_PROCESS_PREFIX = "perfsuite-r"

Device = Literal["cpu", "cuda"]
#: How a launch's processes start: ``warm``, the torchrun agent forked from a warm parent that
#: has imported everything (:mod:`perfsuite.launch.warm`) and the ranks forked from the agent;
#: ``fork``, the agent a fresh interpreter and the ranks its forks; ``exec``, all fresh interpreters.
RankStart = Literal["warm", "fork", "exec"]
RankStatus = Literal["ok", "oom", "crash", "skipped"]
T = TypeVar("T")

#: The marks of one launch's timeline, in the order they happen; each ends the stretch it
#: names (:data:`LAUNCH_STRETCHES`). Wall-clock ``time.time()`` values, comparable across
#: the processes of one host. The gate takes ``spawn``, ``exit`` and ``end``; the agent
#: ``agent_start`` and ``agent_torch`` (passed to its ranks in :data:`AGENT_MARKS_VAR`); each
#: rank the rest. A kind marks only what it has (``device``: cuda only; ``wrap``: training).
LaunchMark = Literal[
    "spawn",
    "agent_start",
    "agent_torch",
    "rank_start",
    "rank_imports",
    "device",
    "process_group",
    "build",
    "wrap",
    "warmup",
    "measure",
    "report",
    "exit",
    "end",
]
LAUNCH_MARKS: tuple[LaunchMark, ...] = get_args(LaunchMark)
#: What the stretch that ends at each mark is (``perfsuite explain --launch`` prints these).
LAUNCH_STRETCHES: Mapping[LaunchMark, str] = {
    "spawn": "gate spawns the torchrun agent",
    "agent_start": "agent process created",
    "agent_torch": "agent: interpreter, imports (torch)",
    "rank_start": "torchrun: rendezvous, start ranks",
    "rank_imports": "rank: interpreter, imports, job",
    "device": "rank: set_device, CUDA context",
    "process_group": "process group init",
    "build": "model build, batches",
    "wrap": "engine wrap, optimizer, compile",
    "warmup": "warmup steps",
    "measure": "measured steps",
    "report": "report (runtime, fingerprint)",
    "exit": "rank and agent exit",
    "end": "gate: sweep leftover processes",
}
#: The resource limits (``resource`` module names) an agent forked from a warm parent takes from
#: the gate, as an exec'd agent inherits them: the ones a training rank's behaviour depends on.
WARM_RLIMITS = ("RLIMIT_DATA", "RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_MEMLOCK")
#: Environment variable through which a torchrun agent hands its own marks (JSON: mark -> time)
#: to the ranks it starts, which put them in their reports.
AGENT_MARKS_VAR = "PERFSUITE_AGENT_MARKS"


def pythonpath_entries(pythonpath: str | None, cwd: str) -> list[str]:
    """PYTHONPATH's entries as an interpreter started in ``cwd`` puts them on its import path:
    made absolute, each once. (``python -m`` puts ``cwd`` itself ahead of them, even when
    PYTHONPATH names it too.)"""
    entries = pythonpath.split(os.pathsep) if pythonpath else []
    return list(dict.fromkeys(os.path.normpath(os.path.join(cwd, entry)) for entry in entries))


class ProtocolError(ValueError):
    """A job or report does not match its dataclass; the message names the field."""


class EngineUnavailable(Exception):
    """This rank cannot run the workload here; the message is the precise skip reason."""


# -- codec --------------------------------------------------------------------------
def encode(value: Any) -> Any:
    """Dataclasses, tuples and mappings as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(cls: type[T], data: Any, where: str = "", decoded: Mapping[str, Any] | None = None) -> T:
    """``cls`` (a dataclass) from JSON ``data``, checking every field's type.

    ``decoded`` supplies fields already decoded by the caller (a polymorphic
    field whose concrete type the data names elsewhere).
    """
    where = where or cls.__name__
    decoded = decoded or {}
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{where}: expected an object, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {unknown}; expected {sorted(fields)}")
    values = dict(decoded)
    for name, f in fields.items():
        if name in decoded:
            continue
        if name in data:
            values[name] = decode_value(hints[name], data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field {name!r}")
    return cls(**values)


def read_work_count(data: Any) -> WorkCount | None:
    """A results file's ``work.count`` as a WorkCount, or None where it holds none. Tolerant: the
    file may come from another revision of perfsuite (``ab-rev``, ``bisect``, ``compare``), so
    fields it does not know are left out and a malformed count reads as none."""
    if not isinstance(data, Mapping):
        return None
    known = {f.name for f in dataclasses.fields(WorkCount)} - {"version"}
    try:
        return decode(WorkCount, {k: v for k, v in data.items() if k in known}, "work.count")
    except ProtocolError:
        return None


def work_count_of(result: Mapping[str, Any]) -> WorkCount | None:
    """A results file row's counted step work (its ``work.count``), read as :func:`read_work_count` does."""
    return read_work_count((result.get("work") or {}).get("count"))


def decode_value(hint: Any, value: Any, where: str) -> Any:
    """One JSON value as type ``hint`` (see :func:`decode`)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return decode_value(inner, value, where)
    if origin is Literal:
        # True == 1 in Python: a bool only matches a bool literal.
        if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in args):
            raise ProtocolError(f"{where}: must be one of {args}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return decode(hint, value, where)  # type: ignore[arg-type]
    if origin is tuple:
        _expect(isinstance(value, list), where, "a list", value)
        return tuple(decode_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        _expect(isinstance(value, Mapping), where, "an object", value)
        inner = args[1] if args else Any
        return {k: decode_value(inner, v, f"{where}[{k!r}]") for k, v in value.items()}
    if hint is float:
        # An int stays an int: exact counts (bytes) must not turn into floats.
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool), where, "a number", value)
        return value
    if hint in (int, str, bool):
        _expect(isinstance(value, hint) and (hint is bool or not isinstance(value, bool)), where, hint.__name__, value)
        return value
    raise ProtocolError(f"{where}: no decoder for type {hint!r}")


def _expect(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        raise ProtocolError(f"{where}: expected {what}, got {value!r}")


def import_object(path: str) -> Any:
    """``"package.module:Qualified.Name"`` -> that object."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def object_path(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


# -- the job --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What one kind of workload needs to run on a rank, resolved for the profile.

    Each workload kind subclasses this in its torch-free module (the training
    loop: :class:`perfsuite.core.workloads.train.TrainSpec`) and names the rank-side
    class that runs it in ``runner``.
    """

    runner: ClassVar[str]  # "module:Class" of the rank-side runner (perfsuite.rank.worker.base.Runner)

    id: str
    """Scenario id (``group.name``)."""
    world_size: int
    """Ranks in the run."""
    warmup_steps: int
    """Minimum warmup steps; warmup goes on until step times settle."""
    max_warmup_steps: int
    """Most warmup steps before measuring regardless."""
    steps: int
    """Measured steps."""


@dataclasses.dataclass(frozen=True)
class RankJob:
    """The job file every rank of one launch reads."""

    spec: WorkloadSpec
    """The workload, typed by its kind."""
    device: Device
    """Device kind of the profile."""
    reports_dir: str
    """Where each rank writes ``rankN.phase`` and ``rankN.json``."""
    rank_memory_budget_mib: int | None = None
    """cpu: RLIMIT_DATA budget above the rank's footprint after imports."""
    device_memory_cap_mib: int | None = None
    """cuda: usable device memory per rank."""
    steady_threshold: float = 0.1
    """Warmup ends once the last step times spread less than this (relative)."""
    slowdown_pct: float = 0.0
    """Planted extra device work per step, in percent of a warmup step (gate self-test)."""
    profile_steps: int = 0
    """Steady-state steps to profile with ``torch.profiler`` after the measured ones (0: none). Set only
    for the extra launch that stores or diffs an op profile; a gated launch never profiles."""
    profile_trace: bool = False
    """With ``profile_steps``: also write rank 0's Chrome trace (the launch that explains a regression)."""
    count_work: bool = False
    """Count what a step does (:mod:`perfsuite.core.workcount`) in a few untimed steps after the
    measured ones; not in a launch that profiles (its counts would carry nothing new)."""
    explain_oom: bool = False
    """Record allocations through the launch (cpu: the profiler's memory records; CUDA: the allocator's
    history) so that an OOM reports its largest allocations. Set only for the launch that explains an OOM."""
    reference_mib: int = 0
    """Bytes (MiB) of the fixed reference workload each rank hashes after every
    measured step, timed, to normalise throughput for the machine's speed of the
    moment (``samples_per_ref``); 0: none."""
    seed: int = 0
    """Seed for weights and synthetic data."""
    imports: tuple[str, ...] = ()
    """Modules the ranks import before the memory budget goes on, however they start (a warm
    parent has them already): the runner's, the engine's, the model's classes. So the budget
    covers the workload, not its libraries, alike for warm, forked and exec'd ranks."""

    def to_json(self) -> dict[str, Any]:
        return {**encode(self), "spec_type": object_path(type(self.spec))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankJob:
        data = dict(data)
        try:
            spec_type = import_object(data.pop("spec_type"))
        except (KeyError, ImportError, AttributeError) as exc:
            raise ProtocolError(f"RankJob: spec_type cannot be resolved ({exc!r})") from None
        spec = decode(spec_type, data.get("spec"), "RankJob.spec")
        return decode(cls, data, "RankJob", decoded={"spec": spec})

    def write(self, path: Path) -> None:
        atomic_write_json(path, self.to_json())

    @classmethod
    def read(cls, path: Path) -> RankJob:
        return cls.from_json(json.loads(path.read_text()))


#: ``RankReport.detail`` key of the FLOPs one rank counted over one training step, for a model
#: without a formula (perfsuite.judge.flops labels the figure ``COUNTED``).
COUNTED_FLOPS = "counted_flops_per_rank_step"


# -- the report -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RankReport:
    """What one rank measured, or why it could not."""

    rank: int
    """Global rank."""
    status: RankStatus
    """ok, oom (an allocation failed), crash, or skipped (EngineUnavailable)."""
    error: str = ""
    """The exception, for a rank that did not finish."""
    host: str = ""
    """Hostname of the rank's node."""
    forked: bool = False
    """Whether the rank was forked from its torchrun agent (a profile's
    ``rank_start``), rather than started as a fresh interpreter."""
    runtime: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """torch/CUDA/NCCL builds, from each node's local rank 0."""
    step_times_s: tuple[float, ...] = ()
    """Wall time of each measured step, device synchronised."""
    warmup_times_s: tuple[float, ...] = ()
    """Slowest-rank time of each warmup step."""
    steady_state_start: int = 0
    """Warmup steps run before measuring."""
    reference_times_s: tuple[float, ...] = ()
    """Time of the reference workload after each measured step (``RankJob.reference_mib``)."""
    losses: tuple[float, ...] = ()
    """Training loss of each measured step (training kinds)."""
    skipped_steps: tuple[int, ...] = ()
    """Measured steps (0-based) whose optimizer update the engine skipped
    (fp16 loss-scale overflow); rates leave them out."""
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """This rank's value of each ``rank``-source metric, by registry name."""
    memory: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Detail behind ``peak_mem_mib``: allocator peaks, NVML, RSS, and on CUDA
    which NVML figure that is (``nvml_scope``) or why there is none (``nvml_error``)."""
    model_state: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Bytes held by category (params, grads, optimizer, total)."""
    health: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Clock, power, temperature, throttle reasons (CUDA) or load (CPU)."""
    step_work: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Work per step of ``steps`` metrics that only the ranks know (the matmul
    shape a best-shape search picked); overrides the scenario's ``step_work()``
    for this launch. Every rank reports the same."""
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Kind-specific facts for the results file (the search table, the FLOP
    formula); rank 0's is kept."""
    op_profile: OpProfile | None = None
    """This rank's op profile (``RankJob.profile_steps``)."""
    work_count: WorkCount | None = None
    """What one of this rank's steps does (``RankJob.count_work``)."""
    marks: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """When this rank (and its agent) reached each :data:`LaunchMark` it passed (``time.time()``)."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = encode(self)
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankReport:
        return decode(cls, data)

    def write(self, path: Path) -> None:
        atomic_write_json(path, self.to_json())
