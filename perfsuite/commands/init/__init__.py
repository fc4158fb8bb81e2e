"""``python -m perfsuite init``: perfsuite in a team's own repository.

Writes a benchmark module with one scenario for the team's model (their build function,
a transformers model type, or an example model to replace), a root ``conftest.py``, an
empty ``baselines/``, a GitHub Actions workflow for self-hosted GPU runners (installing
perfsuite as it is installed here: :mod:`perfsuite.commands.init.install`) and a README snippet.
A team's own root ``conftest.py`` is kept: what perfsuite needs of it is that it sits at the
root (pytest then puts the root on the import path), so init appends its note as comments and
says so. Otherwise it writes nothing when any file it would write exists with other content,
unless ``--force``; files already as it would write them are left alone, so a second run
changes nothing. Pytest side, torch-free: the templates are package data.
"""

from __future__ import annotations

import argparse
import re
import string
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from perfsuite.commands.init.install import Install, how_installed
from perfsuite.core.files import atomic_write_text, unwritable
from perfsuite.core.models import HF_TASKS, hf_tasks_by_type
from perfsuite.core.models.probe import REFERENCE, check_callable

#: What ``init`` writes, relative to the repository: file -> template.
LAYOUT = {
    "bench_tests/test_perf.py": "test_perf.py.tmpl",
    "conftest.py": "conftest.py.tmpl",
    "baselines/.gitignore": "baselines.gitignore.tmpl",
    ".github/workflows/perf.yml": "perf.yml.tmpl",
    "PERFSUITE.md": "PERFSUITE.md.tmpl",
}
#: Files a repository may have already that init adds its part to instead of replacing: the root
#: conftest.py only has to exist (its folder goes on pytest's import path); init's note follows
#: the team's code as comments, below this marker.
MERGED = {"conftest.py": "# perfsuite: added by `python -m perfsuite init`"}
#: The one template with placeholders (``$model_spec``, ``$what``, ``$group``, ``$seq_len``); the others are
#: written as they are, but for the workflow's install (its ``$`` belong to the shell and to GitHub).
SUBSTITUTED = "test_perf.py.tmpl"
WORKFLOW = "perf.yml.tmpl"
#: The example model written when no ``--model`` is given, and its reference.
EXAMPLE = {"perf_models/__init__.py": None, "perf_models/example.py": "example_model.py.tmpl"}
EXAMPLE_REFERENCE = "perf_models.example:build"
#: The example's tokens per sample: its 10 measured steps on 2 cpu ranks then take 0.7-0.9 s in all
#: on the 2-core VM, long enough for the host's 10 ms CPU counters to tell a busy neighbour apart
#: (32 gave 4-6 ms steps, which spread 20-40% each and left the contention check blind;
#: docs/lab/contention.md). Other models keep 32, within a tiny transformers shape's positions.
EXAMPLE_SEQ_LEN, SEQ_LEN = 128, 32
#: A transformers model type's tiny cpu shape (the user sets theirs for GPUs), and an image model's images.
HF_SHAPE = "layers=2, hidden=64, heads=4, vocab=512, ffn=128, max_positions=64"
IMAGE_SHAPE = "image_size=32, patch_size=8"
#: The command that records a fresh repository's baselines.
RECORD = "pytest bench_tests --perf-update-baselines"


@dataclass(frozen=True)
class Model:
    """The scenario's model, as ``init`` writes it."""

    spec: str
    what: str
    group: str
    example: bool = False
    reference: str | None = None
    """The team's ``package.module:function``, which the ranks must be able to import."""

    @classmethod
    def parse(cls, reference: str | None) -> Model:
        """``pkg.mod:build`` (your module), a transformers model type, or None (the example)."""
        if reference is None:
            return cls(f'ModelSpec.module("{EXAMPLE_REFERENCE}")', "the example model", "example", example=True)
        if ":" in reference:
            if not REFERENCE.match(reference):
                raise ValueError(f"--model {reference!r}: a module reference is 'package.module:function'")
            name = reference.rsplit(":", 1)[0].rsplit(".", 1)[-1]
            return cls(f'ModelSpec.module("{reference}")', reference, _identifier(name), reference=reference)
        if not re.fullmatch(r"[a-z0-9_-]+", reference):
            raise ValueError(
                f"--model {reference!r}: give 'package.module:function' (your build function) or a transformers "
                "model type such as llama (a Hub name would need the network)"
            )
        task = _task_for(reference)
        shape = f"{HF_SHAPE}, {IMAGE_SHAPE}" if task == "image_classification" else HF_SHAPE
        named = "" if task == "causal_lm" else f'"{task}", '
        return cls(f'ModelSpec.hf("{reference}", {named}{shape})', f"a {reference} model", _identifier(reference))


def _task_for(model_type: str) -> str:
    """The first of perfsuite's tasks that transformers has a ``model_type`` model for (causal_lm
    when transformers cannot be asked: collection then says what is wrong)."""
    known = hf_tasks_by_type()
    if not known:
        return "causal_lm"
    if model_type not in known:
        raise ValueError(f"--model {model_type!r} is no transformers model type here (e.g. llama, qwen2, vit)")
    if not known[model_type]:
        raise ValueError(f"--model {model_type!r}: transformers has none of {', '.join(HF_TASKS.values())} for it")
    return known[model_type][0]


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name).strip("_").lower() or "model"


def render(model: Model, install: Install | None = None, every_pr: bool = False) -> dict[str, str]:
    """Every file ``init`` writes, by path, with its content; the workflow installs ``install``
    (default: perfsuite as it is installed here) and runs the GPU gate on every pull request from
    the repository when ``every_pr``, else on those labelled ``perf`` or asked with ``/perf``."""
    install = install or how_installed()
    layout = {**LAYOUT, **(EXAMPLE if model.example else {})}
    seq_len = EXAMPLE_SEQ_LEN if model.example else SEQ_LEN
    values = {"model_spec": model.spec, "what": model.what, "group": model.group, "seq_len": str(seq_len)}
    return {path: _text(name, values, install, every_pr) for path, name in layout.items()}


def _text(name: str | None, values: dict[str, str], install: Install, every_pr: bool = False) -> str:
    if name is None:
        return ""
    text = (resources.files(__name__) / "templates" / name).read_text()
    if name == WORKFLOW:
        return (
            text.replace("__PERFSUITE_REQUIREMENT__", install.requirement)
            .replace("__PERFSUITE_SOURCE__", install.source)
            .replace("__PERF_EVERY_PR__", "true" if every_pr else "false")
        )
    return string.Template(text).substitute(values) if name == SUBSTITUTED else text


@dataclass(frozen=True)
class Outcome:
    """What ``init`` did, as paths relative to the repository."""

    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    """Already as init writes them (or, merged files, already holding its note)."""
    added: tuple[str, ...] = ()
    """The team's own files that init appended its note to (``MERGED``)."""


def init(root: Path, model: Model, force: bool, every_pr: bool = False) -> Outcome:
    """Write the files under ``root``. Raises FileExistsError naming the files that exist with other
    content (none written) unless ``force``; a team's own ``MERGED`` file gets init's note appended,
    with ``force`` too."""
    files = render(model, every_pr=every_pr)
    unchanged = [p for p, text in files.items() if (root / p).is_file() and _holds(root / p, p, text)]
    mergeable = [p for p in files if p in MERGED and (root / p).is_file() and p not in unchanged]
    clashing = [p for p in files if (root / p).exists() and p not in unchanged and p not in mergeable]
    if clashing and not force:
        raise FileExistsError(", ".join(clashing))
    written = [p for p in files if p not in unchanged and p not in mergeable]
    for path in written:
        atomic_write_text(root / path, files[path])
    for path in mergeable:
        own = (root / path).read_text()
        atomic_write_text(root / path, own + ("" if own.endswith("\n") else "\n") + "\n" + note(path, files[path]))
    return Outcome(tuple(written), tuple(unchanged), tuple(mergeable))


def _holds(path: Path, relative: str, text: str) -> bool:
    """The file is as init writes it, or (a merged file) already holds init's note."""
    found = path.read_text()
    return found == text or (relative in MERGED and MERGED[relative] in found)


def note(path: str, template: str) -> str:
    """A template docstring as the comment block appended to a team's own file, under its marker."""
    body = template.strip().strip('"').strip()
    return "\n".join([MERGED[path], *(f"# {line}".rstrip() for line in body.splitlines())]) + "\n"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("init", help="set up perfsuite in your repository: scenario, workflow, baselines")
    parser.add_argument("root", nargs="?", type=Path, default=Path("."), help="repository folder (default .)")
    parser.add_argument(
        "--model",
        help="your build function as package.module:function, or a transformers model type (llama, qwen2, vit...); "
        "default: an example model to replace",
    )
    parser.add_argument(
        "--every-pr",
        action="store_true",
        help="the workflow runs the GPU gate on every pull request from this repository (default: on those "
        "labelled perf, or when a member comments /perf)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite files that exist with other content (never your conftest.py: init appends to it)",
    )


def run(ns: argparse.Namespace) -> int:
    """0 when the repository is set up (or already was), 2 for bad input or files in the way."""
    problem = unwritable(ns.root, folder=True)
    if problem:
        print(f"perfsuite init: cannot write in {ns.root}: {problem}", file=sys.stderr)
        return 2
    try:
        model = Model.parse(ns.model)
        done = init(ns.root, model, ns.force, ns.every_pr)
    except ValueError as exc:
        print(f"perfsuite init: {exc}", file=sys.stderr)
        return 2
    except FileExistsError as exc:
        print(
            f"perfsuite init: these files exist with other content, so nothing was written: {exc}. "
            "Move them away, or overwrite them with --force",
            file=sys.stderr,
        )
        return 2
    for path in done.written:
        print(f"wrote {ns.root / path}")
    for path in done.added:
        print(
            f"kept your {ns.root / path} (at the root, it already puts the repository on the import path) "
            "and appended perfsuite's note to it as comments: where your runners' profiles go"
        )
    if not done.written and not done.added:
        print(f"perfsuite init: {ns.root} is already set up ({len(done.unchanged)} files as init writes them)")
    not_yet = check_callable(model.reference, str(ns.root.resolve())) if model.reference else None
    if not_yet:  # it may be once the team's package is installed, so this is no error
        print(f"note: {not_yet}; `pytest bench_tests` fails its collection until it imports")
    print(
        f"next: record this machine's baselines with `{RECORD}` (in {ns.root}), commit baselines/, then "
        "`pytest bench_tests` judges every run against them"
    )
    return 0
