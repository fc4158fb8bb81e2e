"""Which machine measured a baseline, against the machine measuring now.

A baseline's fingerprint names the processor (:mod:`perfsuite.processor`) and
each GPU card by UUID and serial (:func:`perfsuite.fingerprint.card`). A
verdict against a baseline from another processor or card names both, so a
drop can be traced to the hardware rather than the code. Whether a timed metric
is still judged then is the profile's call
(``HardwareProfile.timed_on_other_processor``), made in :mod:`perfsuite.judging`.
Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perfsuite import processor as processors

#: Processor fields that make two processors the same one for timing purposes.
PROCESSOR_FIELDS = ("vendor", "model", "family", "model_number", "stepping", "cores", "features")
#: Card settings that bound a card's speed; a change is named beside the verdict, the card stays judged.
CARD_SETTINGS = ("power_limit_w", "app_clocks_mhz", "ecc", "nvlinks")

UNKNOWN = (
    "its baseline's machine identity is unknown (recorded before perfsuite kept {what}): a change of "
    "{part} cannot be told apart from a change of code; re-record it with --perf-update-baselines to keep it"
)


@dataclass(frozen=True)
class MachineChange:
    """The baseline was recorded on another ``part`` than this run's."""

    part: Literal["processor", "card"]
    recorded: str
    current: str

    def describe(self) -> str:
        return f"recorded on another {self.part}: {self.recorded}; this run: {self.current}"


@dataclass(frozen=True)
class Identity:
    """How this run's machine compares with its baseline's."""

    changes: tuple[MachineChange, ...] = ()
    #: Why the baseline's identity cannot be compared ("" when it can).
    unknown: str = ""

    def of(self, part: str) -> MachineChange | None:
        return next((c for c in self.changes if c.part == part), None)

    def notes(self) -> list[str]:
        """What a verdict says about the machine: each change, or the unknown identity."""
        return [c.describe() for c in self.changes] + ([self.unknown] if self.unknown else [])


def compare(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> Identity:
    """This run's machine (``current``) against the one its baseline was recorded on."""
    changes, unknown = [], []
    old_cpu, new_cpu = recorded.get("processor"), current.get("processor")
    if not isinstance(old_cpu, Mapping):
        unknown.append(("the processor", "processor"))
    elif isinstance(new_cpu, Mapping) and _key(old_cpu) != _key(new_cpu):
        changes.append(MachineChange("processor", processors.describe(old_cpu), processors.describe(new_cpu)))
    old_gpus, new_gpus = _cards(recorded), _cards(current)
    if new_gpus and not any(g.get("uuid") for g in old_gpus):
        unknown.append(("the cards' UUIDs", "card"))
    else:
        changed = [
            (i, a, b)
            for i, (a, b) in enumerate(zip(old_gpus, new_gpus, strict=False))
            if a.get("uuid") != b.get("uuid")
        ]
        if changed:
            changes.append(MachineChange("card", _cards_text(changed, 1), _cards_text(changed, 2)))
    if not unknown:
        return Identity(tuple(changes))
    what, part = " and ".join(u[0] for u in unknown), " or ".join(u[1] for u in unknown)
    return Identity(tuple(changes), UNKNOWN.format(what=what, part=part))


def card_setting_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Settings that bound the cards' speed and moved since the baseline (named beside a verdict)."""
    found = []
    for index, (old, new) in enumerate(zip(_cards(recorded), _cards(current), strict=False)):
        for name in CARD_SETTINGS:
            if name in old and old.get(name) != new.get(name):
                found.append(f"GPU {index} {name} {old.get(name)} -> {new.get(name)}")
    if "interconnect" in recorded and recorded.get("interconnect") != current.get("interconnect"):
        found.append(f"interconnect {recorded.get('interconnect')} -> {current.get('interconnect')}")
    return found


def _key(proc: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(str(proc.get(name)) for name in PROCESSOR_FIELDS)


def _cards(fingerprint: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [g for g in fingerprint.get("gpus") or [] if isinstance(g, Mapping)]


def _cards_text(changed: Sequence[tuple[int, Mapping[str, Any], Mapping[str, Any]]], side: Literal[1, 2]) -> str:
    """The changed cards of one side (1: the baseline's, 2: this run's)."""
    return ", ".join(f"GPU {change[0]} {describe_card(change[side])}" for change in changed)


def describe_card(gpu: Mapping[str, Any]) -> str:
    """One card in a verdict: ``NVIDIA H100 80GB HBM3 GPU-5f3c... (serial 1650...)``."""
    serial = f" (serial {gpu['serial']})" if gpu.get("serial") else ""
    uuid = f" {gpu['uuid']}" if gpu.get("uuid") else ""
    return f"{gpu.get('name')}{uuid}{serial}"
