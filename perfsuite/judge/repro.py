"""The commands that run a failed row again and settle it (issue 57): the same pytest run of that
one row here, an A/B of this checkout against its parent commit on this machine, and a bisect from
the commit its baseline was recorded at.

:func:`repro` is pure; :func:`settings_flags` picks, from a run's own command line, the flags that
decide what a row measures or how it is judged (the plugin's ``options.JUDGING_FLAGS``), so the
rerun judges as the failed run did.
Pytest side, torch-free.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Of those, what an A/B sets itself or what would defeat it: its own empty baselines folder, a
#: slowdown planted in both sides alike, and the stored-baseline gate's repeats.
NOT_FOR_AB = frozenset({"--perf-baselines", "--perf-inject-slowdown", "--perf-repeats", "--perf-confirm"})


@dataclass(frozen=True)
class Repro:
    """How to run a failed row again (``rerun``), and how to settle whether the code made it slower
    on this machine (``ab_rev``) and which commit did (``bisect``; None: the baseline names no
    commit to start from)."""

    rerun: str
    ab_rev: str
    bisect: str | None = None

    @classmethod
    def of(cls, found: Any) -> Repro | None:
        """A results file's ``repro``; None for a pass, an older file, or another perfsuite's fields."""
        if not isinstance(found, Mapping):
            return None
        try:
            return cls(**found)
        except TypeError:
            return None

    def labelled(self) -> list[tuple[str, str]]:
        """Each command with what it is for."""
        return [
            ("run it again", self.rerun),
            ("settle it on this machine", self.ab_rev),
            *([("find the commit", self.bisect)] if self.bisect else []),
        ]

    def lines(self) -> list[str]:
        return [f"{label}: {command}" for label, command in self.labelled()]

    def to_json(self) -> dict[str, Any]:
        return {"rerun": self.rerun, "ab_rev": self.ab_rev, "bisect": self.bisect}


def settings_flags(args: Sequence[str], profile: str, names: Collection[str]) -> tuple[str, ...]:
    """The flags ``names`` on a command line, each as one ``--flag=value`` word in their order, and
    the profile it ran on when the line did not name it (a profile the machine picked is pinned,
    so the rerun judges as this run did)."""
    found: list[str] = []
    words = list(args)
    for at, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in names:
            continue
        if not eq:
            if at + 1 >= len(words):
                continue
            value = words[at + 1]
        found.append(f"{name}={value}")
    if not any(flag.startswith("--perf-profile=") for flag in found) and profile:
        found.insert(0, f"--perf-profile={profile}")
    return tuple(found)


def repro(nodeid: str, flags: Sequence[str], baseline: Mapping[str, Any] | None = None) -> Repro:
    """The commands for the row ``nodeid`` (as the run's invocation folder selects it), run with
    ``flags`` (:func:`settings_flags`); ``baseline`` (its stored form) gives bisect a good commit."""
    node = shlex.quote(nodeid)
    ab_flags = " ".join(shlex.quote(f) for f in flags if f.partition("=")[0] not in NOT_FOR_AB)
    rerun = " ".join(["pytest", node, *(shlex.quote(f) for f in flags)])
    ab_rev = " ".join(filter(None, ["python -m perfsuite ab-rev HEAD~1", node, ab_flags]))
    good = _good_commit(baseline)
    bisect = " ".join(filter(None, [f"python -m perfsuite bisect {good[:12]} HEAD", node, ab_flags])) if good else None
    return Repro(rerun, ab_rev, bisect)


def _good_commit(baseline: Mapping[str, Any] | None) -> str | None:
    """The commit a baseline was recorded at, if clean (a dirty checkout's is not that commit's code)."""
    provenance = (baseline or {}).get("provenance")
    if not isinstance(provenance, Mapping) or provenance.get("dirty"):
        return None
    commit = provenance.get("commit")
    return commit if isinstance(commit, str) and commit else None
