"""Checks of a model reference or an option that need torch, asked of a child interpreter.

The pytest process never imports torch, and transformers' auto classes and a team's model
module do. So :func:`hf_model_types` asks a child for the model types transformers knows and
the tasks each takes, :func:`hf_attribute_map` for the keys a config stores its shape under,
and, for a ``ModelSpec.module`` reference, :func:`build_problem` has a child (``python -m
perfsuite.rank.models.module``) import the build function and the optional step function, call
the build on the ``meta`` device (shapes only, no memory) and check that it returns a
:class:`perfsuite.rank.models.module.Recipe`. It answers with the field at fault and what is
wrong, as JSON. One child per distinct reference, path and session.

Values never call these as they are built (a rank decodes the same values and must start no
child): the pytest side's collection step (:mod:`perfsuite.plugin.collection`) does, with the
ranks' PYTHONPATH as an argument.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsuite.core.files import atomic_write_text, user_cache

#: ``package.module:function``.
REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
#: How long the child may take: importing torch and the team's module, building on meta.
PROBE_TIMEOUT_S = 300


def reference_problem(source: str | None, step: str | None) -> tuple[str, str] | None:
    """(field, problem) for a ``source`` or ``step`` that is no ``package.module:function``, else None
    (the form alone: no child)."""
    for name, value in (("source", source), ("step", step)):
        if value is None and name == "step":
            continue
        if not isinstance(value, str) or not REFERENCE.match(value):
            return name, f"must be 'package.module:function', got {value!r}"
    return None


def build_problem(source: str, step: str | None, options: Any, rank_path: str) -> tuple[str, str] | None:
    """(field, problem) for well-formed references that a child on ``rank_path`` (the ranks'
    PYTHONPATH: what passes here imports on every rank) cannot import or build, else None."""
    return _probe(source, step, json.dumps(options, sort_keys=True), rank_path)


@functools.lru_cache(maxsize=64)
def _probe(source: str, step: str | None, options: str, path: str) -> tuple[str, str] | None:
    env = {**os.environ, "PYTHONPATH": path}
    argv = [sys.executable, "-m", "perfsuite.rank.models.module", source, step or "", options]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        return "source", f"was not built within {PROBE_TIMEOUT_S} s on the meta device (collection-time check)"
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return "source", f"could not be checked: the child interpreter said {done.stderr.strip()[-500:]!r}"
    return (answer["field"], _with_hint(answer["problem"], path)) if answer else None


def _with_hint(problem: str, path: str) -> str:
    """A module the child could not find is on no path the ranks get: say which, and what helps."""
    if not problem.startswith("cannot be imported: ModuleNotFoundError"):
        return problem
    return (
        f"{problem} (the ranks import it with PYTHONPATH={path}: put its package under the rootdir, "
        "beside the root conftest.py, or install it into this environment)"
    )


#: The child's answer for :func:`check_callable`: "" or what is wrong with the reference.
_CALLABLE = """
import importlib, json, sys
module, _, name = sys.argv[1].partition(":")
try:
    found = importlib.import_module(module)
except Exception as exc:
    print(json.dumps(f"cannot be imported: {type(exc).__name__}: {exc}"))
else:
    ok = callable(getattr(found, name, None))
    print(json.dumps("" if ok else f"names no function: module {module!r} has no callable {name!r}"))
"""


@functools.lru_cache(maxsize=64)
def check_callable(reference: str, rank_path: str) -> str | None:
    """What is wrong with a ``package.module:function`` reference (None when a child interpreter,
    on ``rank_path``, the ranks' PYTHONPATH, imports it and finds a callable there)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CALLABLE, reference],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": rank_path},
            check=False,
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, IndexError, ValueError):
        return f"{reference!r} could not be checked: the child interpreter importing it failed"
    return f"{reference!r} {_with_hint(answer, rank_path)}" if answer else None


#: The child's answer for :func:`hf_model_types`: each model type with the tasks that take it.
_HEADS = """
import json, sys, transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
tasks = json.loads(sys.argv[1])
heads = {task: set(getattr(transformers, auto)._model_mapping._model_mapping) for task, auto in tasks.items()}
print(json.dumps({kind: [task for task in tasks if kind in heads[task]] for kind in CONFIG_MAPPING_NAMES}))
"""


@functools.lru_cache(maxsize=1)
def hf_model_types(auto_classes: tuple[tuple[str, str], ...]) -> Mapping[str, tuple[str, ...]]:
    """Each model type this transformers knows, with the tasks of ``auto_classes`` ((task, auto
    class) pairs) whose auto class has a model for it, in their order: ``vit`` takes no causal LM head.
    Asked of a child interpreter, since transformers' auto module imports torch, which the
    pytest process never does. Empty when transformers is missing: the ranks then fail with
    transformers' own words."""
    answer = _ask(_HEADS, json.dumps(dict(auto_classes)))
    return {kind: tuple(tasks) for kind, tasks in answer.items()} if isinstance(answer, dict) else {}


#: The child's answer for :func:`hf_attribute_map` ({} for a type transformers does not know:
#: collection then names the type as unknown).
_ATTRIBUTES = """
import json, sys, transformers
try:
    print(json.dumps(transformers.AutoConfig.for_model(sys.argv[1]).attribute_map))
except ValueError:
    print("{}")
"""


@functools.lru_cache(maxsize=16)
def hf_attribute_map(model_type: str) -> Mapping[str, str] | None:
    """The ``attribute_map`` of ``model_type``'s config class: a config key every architecture
    understands -> the key this one stores it under (GPT-2: ``hidden_size`` -> ``n_embd``).
    Empty when transformers is missing; None when it is installed and its child failed, since
    reading a config.json without the map would build another model than the file's."""
    if importlib.util.find_spec("transformers") is None:
        return {}
    answer = _ask(_ATTRIBUTES, model_type)
    return answer if isinstance(answer, dict) else None


def _ask(code: str, argument: str) -> Any:
    """What a child interpreter running ``code`` printed as JSON (None when it failed), from the
    answers kept for this transformers where it was asked before: each child imports transformers
    (4-6 s of CPU), and every pytest run that collects an ``hf`` model asked two of them."""
    kept = _kept_answer(code, argument)
    if kept is not None and kept.is_file():
        with contextlib.suppress(OSError, ValueError):
            return json.loads(kept.read_text())
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, argument], capture_output=True, text=True, timeout=120, check=True
        )
        answer = json.loads(done.stdout)
    except (subprocess.SubprocessError, ValueError, OSError):
        return None
    if kept is not None:
        with contextlib.suppress(OSError):  # a cache it cannot write costs the next run a child
            atomic_write_text(kept, done.stdout)
    return answer


def _kept_answer(code: str, argument: str) -> Path | None:
    """Where the answer of ``code`` about ``argument`` is kept for the transformers installed here:
    keyed by this interpreter, transformers' version and its auto-configuration module's size and
    time (an edited or reinstalled transformers asks again). None without transformers."""
    spec = importlib.util.find_spec("transformers")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    try:
        auto = (Path(spec.origin).parent / "models" / "auto" / "configuration_auto.py").stat()
        version = importlib.metadata.version("transformers")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    key = json.dumps([code, argument, sys.executable, sys.version, version, auto.st_size, auto.st_mtime_ns])
    return user_cache("probes") / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
