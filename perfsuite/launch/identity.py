"""Which machine measured a baseline, against the machine measuring now.

A baseline's fingerprint names the processor (:mod:`perfsuite.core.processor`) and
each GPU card by UUID and serial (:func:`perfsuite.launch.fingerprint.card`). A
verdict against a baseline from another processor or card names both, so a
drop can be traced to the hardware rather than the code. Whether a timed metric
is still judged then is the profile's call
(``HardwareProfile.timed_on_other_processor``), made in :mod:`perfsuite.judge.judging`.
Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perfsuite.core import processor as processors

#: Processor fields that make two processors the same one for timing purposes.
PROCESSOR_FIELDS = processors.PROCESSOR_FIELDS
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
    elif isinstance(new_cpu, Mapping) and processors.key(old_cpu) != processors.key(new_cpu):
        changes.append(MachineChange("processor", processors.describe(old_cpu), processors.describe(new_cpu)))
    card, unknown_cards = _card_change(_cards(recorded), _cards(current))
    changes += [card] if card is not None else []
    unknown += [("the cards' UUIDs", "card")] if unknown_cards else []
    if not unknown:
        return Identity(tuple(changes))
    what, part = " and ".join(u[0] for u in unknown), " or ".join(u[1] for u in unknown)
    return Identity(tuple(changes), UNKNOWN.format(what=what, part=part))


def times_here(recorded: Mapping[str, Any], current: Mapping[str, Any], across_processors: bool) -> bool:
    """Whether a baseline recorded on ``recorded`` can judge this machine's timing: always where the
    profile compares timings across processors, else only on the processor that recorded it."""
    return across_processors or compare(recorded, current).of("processor") is None


def _card_change(old: list[Mapping[str, Any]], new: list[Mapping[str, Any]]) -> tuple[MachineChange | None, bool]:
    """The cards this run measured on that its baseline's did not (by UUID, whatever their index or
    order), and whether the baseline's cards are unknown (recorded before UUIDs were kept)."""
    if not old or not new:
        return None, False  # a baseline without GPUs, or a run without: the GPU count says so
    if not any(g.get("uuid") for g in old):
        return None, True
    before, now = {g.get("uuid") for g in old}, {g.get("uuid") for g in new}
    added = [g for g in new if g.get("uuid") and g["uuid"] not in before]
    if not added:
        return None, False
    gone = [g for g in old if g.get("uuid") not in now]
    return MachineChange("card", _cards_text(gone) or "-", _cards_text(added)), False


def card_setting_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Settings that bound the cards' speed and moved since the baseline (named beside a verdict):
    each card against the same card (by UUID) in the baseline, or the card at its position there."""
    found = []
    old_cards = _cards(recorded)
    by_uuid = {g["uuid"]: g for g in old_cards if g.get("uuid")}
    for position, new in enumerate(_cards(current)):
        old = by_uuid.get(new.get("uuid")) or (old_cards[position] if position < len(old_cards) else {})
        for name in CARD_SETTINGS:
            if name in old and old.get(name) != new.get(name):
                found.append(f"GPU {new.get('index', position)} {name} {old.get(name)} -> {new.get(name)}")
    if "interconnect" in recorded and recorded.get("interconnect") != current.get("interconnect"):
        found.append(f"interconnect {recorded.get('interconnect')} -> {current.get('interconnect')}")
    return found


def _cards(fingerprint: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [g for g in fingerprint.get("gpus") or [] if isinstance(g, Mapping)]


def _cards_text(cards: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"GPU {g.get('index', '?')} {describe_card(g)}" for g in cards)


def describe_card(gpu: Mapping[str, Any]) -> str:
    """One card in a verdict: ``NVIDIA H100 80GB HBM3 GPU-5f3c... (serial 1650...)``."""
    serial = f" (serial {gpu['serial']})" if gpu.get("serial") else ""
    uuid = f" {gpu['uuid']}" if gpu.get("uuid") else ""
    return f"{gpu.get('name')}{uuid}{serial}"


def machine(fingerprint: Mapping[str, Any]) -> tuple[str, str]:
    """Which machine measured, as (key, words): its cards by UUID where it has any (the card is what
    a GPU row times), else its host and processor."""
    cards = [g for g in fingerprint.get("gpus") or [] if isinstance(g, Mapping) and g.get("uuid")]
    if cards:
        return "cards " + ",".join(sorted(str(g["uuid"]) for g in cards)), ", ".join(map(describe_card, cards))
    host = str(fingerprint.get("host") or "an unnamed host")
    return f"host {host}: {processor_text(fingerprint)}", f"{host} ({processor_text(fingerprint)})"


def processor_text(fingerprint: Mapping[str, Any]) -> str:
    """The processor a fingerprint names, in words (the older ``cpu`` string where it has no processor)."""
    proc = fingerprint.get("processor")
    return processors.describe(proc) if isinstance(proc, Mapping) else str(fingerprint.get("cpu") or "unknown")
