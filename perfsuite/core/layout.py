"""The parallel layout of a scenario: data x tensor x pipeline parallel.

One validated object, built from ``strategy_options`` (``tp``, ``pp``,
``schedule``, ``microbatches``, ``virtual_stages``) and the world size, so
every consumer agrees on dp = world / (tp * pp) and a bad grid is refused at
collection with a readable message. Importable without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b", "interleaved_1f1b")


class LayoutError(ValueError):
    """A parallel layout that cannot run; the message says what to change."""


@dataclass(frozen=True)
class ParallelLayout:
    dp: int
    tp: int = 1
    pp: int = 1
    schedule: Schedule = "1f1b"
    microbatches: int = 1  # pipeline micro-batches per step (per data-parallel replica)
    virtual_stages: int = 1  # stages per pipeline rank (interleaved schedules)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "microbatches", "virtual_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LayoutError(f"parallel layout: {name} must be an int >= 1, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"parallel layout: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule == "interleaved_1f1b":
            if self.virtual_stages < 2:
                raise LayoutError("parallel layout: interleaved_1f1b needs virtual_stages >= 2")
            if self.microbatches % self.pp:
                raise LayoutError(
                    f"parallel layout: interleaved_1f1b needs microbatches ({self.microbatches}) "
                    f"to be a multiple of pp ({self.pp})"
                )
        elif self.schedule == "1f1b" and self.pp > 1 and self.microbatches < self.pp:
            raise LayoutError(
                f"parallel layout: 1f1b needs microbatches ({self.microbatches}) >= pp ({self.pp}) to fill the pipeline"
            )
        elif self.virtual_stages != 1:
            raise LayoutError(
                f"parallel layout: virtual_stages > 1 needs schedule interleaved_1f1b, not {self.schedule}"
            )

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def stages(self) -> int:
        return self.pp * self.virtual_stages

    @classmethod
    def from_options(cls, world_size: int, options: Mapping[str, Any]) -> ParallelLayout:
        """Layout for ``world_size`` ranks; dp is what tp x pp leaves over."""
        tp, pp = options.get("tp", 1), options.get("pp", 1)
        for name, value in (("tp", tp), ("pp", pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LayoutError(f"parallel layout: {name} must be an int >= 1, got {value!r}")
        if world_size % (tp * pp):
            raise LayoutError(
                f"parallel layout: dp x tp x pp must equal the world size, but tp={tp} x pp={pp} = "
                f"{tp * pp} does not divide world_size={world_size}; change world_size or tp/pp"
            )
        return cls(
            dp=world_size // (tp * pp),
            tp=tp,
            pp=pp,
            schedule=options.get("schedule", "1f1b"),
            microbatches=options.get("microbatches", 1),
            virtual_stages=options.get("virtual_stages", 1),
        )

    def bubble_fraction(self) -> float:
        """Idle share of a pipeline step by the schedule's formula.

        GPipe and 1F1B: (p - 1) / (m + p - 1); interleaved 1F1B with v virtual
        stages per rank: (p - 1) / (v * m + p - 1) (Narayanan et al. 2021).
        """
        p, m, v = self.pp, self.microbatches, self.virtual_stages
        return (p - 1) / (v * m + p - 1)

    def check_layers(self, layers: int) -> None:
        if layers % self.stages:
            raise LayoutError(
                f"parallel layout: {layers} layers do not split evenly into {self.stages} pipeline stages"
            )

    def check_heads(self, heads: int, hidden: int, vocab: int) -> None:
        for name, value in (("heads", heads), ("hidden", hidden), ("vocab", vocab)):
            if value % self.tp:
                raise LayoutError(f"parallel layout: model {name}={value} must be divisible by tp={self.tp}")
