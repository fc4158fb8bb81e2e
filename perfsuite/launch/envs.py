"""Named Python environments the ranks of a scenario may run in.

``--perf-env NAME=PYTHON`` names an interpreter (a venv's ``bin/python``);
a scenario's ``env`` field or ``--perf-ab BASE,CANDIDATE`` picks one per
launch. ``current`` is the interpreter running pytest. The torchrun agent and
every rank of that launch run with the chosen interpreter, with perfsuite's
own source put on their path, so the environment needs torch and the engines
but not perfsuite. Its packages are probed once (a subprocess: the pytest
process never imports torch) for the fingerprint and the stack-change report,
and its baselines live apart from the default environment's, under
``baselines/<profile>@<name>/``. Pytest side, torch-free.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CURRENT = "current"
#: How to build the environments perfsuite knows by name (the skip message names it).
BUILD_COMMANDS = {"ort": "make env-ort"}
_PROBE = """
import importlib.metadata as m, json, platform, sys
names = json.loads(sys.argv[1])
versions = {}
for name in names:
    try:
        versions[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps({"python": platform.python_version(), "packages": versions}))
"""


class EnvError(ValueError):
    """A malformed ``--perf-env`` / ``--perf-ab`` value; the message names the flag."""


@dataclass(frozen=True)
class PythonEnv:
    """One named interpreter."""

    name: str
    """The name scenarios and ``--perf-ab`` use."""
    python: str
    """Path of its interpreter."""

    @property
    def is_current(self) -> bool:
        return self.python == sys.executable

    def missing(self) -> str | None:
        """Why this interpreter cannot run ranks (None if it can), with the command that builds it."""
        if Path(self.python).is_file() and os.access(self.python, os.X_OK):
            return None
        return f"environment {self.name!r}: {self.python} is not an executable Python{build_hint(self.name)}"

    def probe(self, packages: tuple[str, ...]) -> dict[str, Any]:
        """Its Python version and the versions of ``packages`` installed in it (once per session)."""
        return dict(_probe(self.python, self.name, packages))

    def worker_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (the variables every rank gets) with what its ranks also need: perfsuite's source
        first on the path, since the environment need not install it, before ``base``'s path (the
        project's rootdir and invocation folder, where a scenario's own modules are found; this
        process's own PYTHONPATH when ``base`` has none)."""
        source = str(Path(__file__).resolve().parents[2])  # the folder that holds perfsuite/
        rest = base.get("PYTHONPATH") or os.environ.get("PYTHONPATH")
        return {**base, "PYTHONPATH": os.pathsep.join([source, *([rest] if rest else [])])}


@functools.cache
def _probe(python: str, name: str, packages: tuple[str, ...]) -> dict[str, Any]:
    out = subprocess.run(
        [python, "-c", _PROBE, json.dumps(list(packages))], capture_output=True, text=True, check=False, timeout=120
    )
    if out.returncode != 0:
        raise EnvError(f"environment {name!r} ({python}) failed to report its packages: {out.stderr.strip()[-300:]}")
    probed: dict[str, Any] = json.loads(out.stdout)
    return probed


def build_hint(name: str) -> str:
    command = BUILD_COMMANDS.get(name)
    where = f".venv-{name}/bin/python"
    if command:
        return f"; build it with `{command}` and pass --perf-env {name}={where}"
    return f"; create a venv with torch and the engines and pass --perf-env {name}={where}"


def parse_envs(values: list[str]) -> dict[str, PythonEnv]:
    """``--perf-env`` values (``NAME=PYTHON``) plus ``current``."""
    envs = {CURRENT: PythonEnv(CURRENT, sys.executable)}
    for value in values:
        name, sep, python = value.partition("=")
        if not sep or not name or not python:
            raise EnvError(f"--perf-env takes NAME=PATH_TO_PYTHON, got {value!r}")
        if not name.replace("_", "").replace("-", "").isalnum() or name == CURRENT:
            raise EnvError(f"--perf-env name {name!r} must be letters, digits, '-' or '_', and not {CURRENT!r}")
        envs[name] = PythonEnv(name, str(Path(python).expanduser()))
    return envs


def parse_ab(value: str | None, envs: dict[str, PythonEnv]) -> tuple[str, str] | None:
    """``--perf-ab BASE,CANDIDATE`` as two environment names."""
    if not value:
        return None
    names = [n.strip() for n in value.split(",")]
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise EnvError(f"--perf-ab takes two different environment names BASE,CANDIDATE, got {value!r}")
    unknown = [n for n in names if n not in envs]
    if unknown:
        raise EnvError(
            f"--perf-ab names {', '.join(map(repr, unknown))}, not given with --perf-env NAME=PYTHON "
            f"(known: {', '.join(envs)})"
        )
    return names[0], names[1]
