"""Collection-time checks of a model reference that need torch, asked of a child interpreter.

The pytest process never imports torch, and transformers' auto classes and a team's model
module do. So :func:`hf_model_types` asks a child for the model types transformers knows,
and, for a ``ModelSpec.module`` reference, a child (``python -m perfsuite.models.module``)
imports the build function and the optional step function, calls the build on the ``meta``
device (shapes only, no memory) and checks that it returns a
:class:`perfsuite.models.module.Recipe`. It answers with the
field at fault and what is wrong, as JSON. One child per distinct reference and session.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from typing import Any

#: ``package.module:function``.
REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
#: How long the child may take: importing torch and the team's module, building on meta.
PROBE_TIMEOUT_S = 300


def check_module(source: str | None, step: str | None, options: Any, build: bool = True) -> tuple[str, str] | None:
    """(field, problem) for a reference that cannot be built, else None; ``build=False`` checks the
    references' form only (a rank, which builds the model itself)."""
    for name, value in (("source", source), ("step", step)):
        if value is None and name == "step":
            continue
        if not isinstance(value, str) or not REFERENCE.match(value):
            return name, f"must be 'package.module:function', got {value!r}"
    return _probe(str(source), step, json.dumps(options, sort_keys=True)) if build else None


@functools.lru_cache(maxsize=64)
def _probe(source: str, step: str | None, options: str) -> tuple[str, str] | None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, "-m", "perfsuite.models.module", source, step or "", options]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        return "source", f"was not built within {PROBE_TIMEOUT_S} s on the meta device (collection-time check)"
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return "source", f"could not be checked: the child interpreter said {done.stderr.strip()[-500:]!r}"
    return (answer["field"], answer["problem"]) if answer else None


@functools.lru_cache(maxsize=1)
def hf_model_types() -> frozenset[str]:
    """The model types this transformers knows. Asked of a child interpreter, since transformers'
    auto module imports torch, which the pytest process never does. Empty when transformers is
    missing: the ranks then fail with transformers' own words."""
    code = (
        "import json, transformers.models.auto.configuration_auto as c; print(json.dumps(list(c.CONFIG_MAPPING_NAMES)))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return frozenset(json.loads(done.stdout))
    except (subprocess.SubprocessError, ValueError, OSError):
        return frozenset()
