"""Collect every wheel ``make bench`` needs, for a GPU node without internet.

Run on a connected machine (``make wheelhouse WHEELHOUSE=DIR``); copy DIR to
the node and run ``make bench WHEELHOUSE=DIR`` there: it installs with pip's
``--no-index --find-links DIR`` and no isolated build, so nothing is fetched.
``make gpu-kit`` is the same wheelhouse for the GPU image's Python and
platform, less what that image already has (``--exclude-installed``).

1. perfsuite itself is built here into a wheel, and then the engines PyPI
   ships only as sources (DeepSpeed, fairscale) that ``perfsuite[EXTRAS]``
   requires on the target: read from that wheel's metadata, extras that name
   other extras (groups such as ``engines``) followed, markers evaluated for
   the target (DeepSpeed with ``DS_BUILD_OPS=0``: no ops compiled). They
   must come out pure Python; one that is not is refused, since it would not
   run on another platform.
2. pip resolves ``perfsuite[EXTRAS]`` for the target Python and platform
   (``--dry-run --report``, metadata only), with environment markers
   evaluated for the target, and every resolved package is downloaded as a
   wheel for that target.
3. The runner's own CUDA stack is left out: torch, and every package the
   resolution reaches only through torch's own requirements (triton, the
   nvidia-* and cuda-* runtime), read from torch's metadata in the report. A
   GPU runner keeps its torch, which satisfies perfsuite's ``torch>=2.4``.
   For a machine without torch, ``--with-torch torch==X`` adds it, stack and all.
4. ``--exclude-installed FILE`` (a ``pip freeze`` or a list of names) also
   leaves out every package named there, and its ``name==version`` lines
   constrain the resolution, so what is collected works with those versions.

Standard library and pip only: it runs with any Python that has pip.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pip as pip_package
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version

#: Packages PyPI ships only as sources: built here when perfsuite[EXTRAS] requires them.
SOURCE_ONLY = ("deepspeed", "fairscale")
#: The extras collected by default: `make setup`'s default (the Makefile's EXTRAS), so it installs from the folder.
EXTRAS = "dev"
#: The runner's CUDA torch, never replaced: it and what only it requires are left out unless --with-torch.
RUNNER = "torch"
#: Build backend of an editable install without build isolation.
BUILD_BACKEND = "setuptools>=68"
#: pip with environment markers evaluated for the target: --python-version and
#: --platform choose wheels but markers still see this interpreter
#: (pypa/pip#11010), which would drop ``megatron-core; python_version >= '3.12'``
#: from a 3.12 wheelhouse built on 3.11. argv[1] is the marker environment as JSON.
PIP_FOR_TARGET = (
    "import json, sys; import pip._vendor.packaging.markers as m; env = json.loads(sys.argv.pop(1)); "
    "m.default_environment = lambda: dict(env); from pip._internal.cli.main import main; sys.exit(main(sys.argv[1:]))"
)
#: Before 24.2, ``pip install --python-version`` checked Requires-Python against
#: this interpreter (pypa/pip#12216): megatron-core (>=3.12) failed on 3.11 after minutes of backtracking.
CROSS_PIP = "24.2"
LINUX_TAG = re.compile(r"^(?:manylinux_\d+_\d+|manylinux\d+|musllinux_\d+_\d+|linux)_(\w+)$")

Item = dict[str, Any]


def normalize(name: str) -> str:
    """PEP 503 name: what pip compares."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pip(*args: str, environment: dict[str, str] | None = None) -> None:
    """Run pip; with ``environment``, markers are evaluated in that environment."""
    cmd = [sys.executable, "-m", "pip", *args]
    if environment is not None:
        cmd = [sys.executable, "-c", PIP_FOR_TARGET, json.dumps(environment), *args]
    shown = " ".join(args)
    print(
        f"+ pip {shown}" + (f"  (markers: Python {environment['python_version']})" if environment else ""), flush=True
    )
    subprocess.run(cmd, check=True, env={**os.environ, "DS_BUILD_OPS": "0"})


def platform_flags(python: str, platform: str) -> list[str]:
    """pip's target flags; a manylinux_2_X tag also accepts older manylinux wheels."""
    tags = [platform]
    found = re.match(r"manylinux_(\d+)_(\d+)_(\w+)$", platform)
    if found:
        major, minor, arch = int(found[1]), int(found[2]), found[3]
        tags += [f"manylinux_{major}_{m}_{arch}" for m in range(minor - 1, 4, -1)]
        tags += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    flags = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for tag in tags:
        flags += ["--platform", tag]
    return flags


def target_environment(python: str, platform: str) -> dict[str, str]:
    """PEP 508 marker values of a CPython ``python`` (X.Y or X.Y.Z) on a Linux ``platform`` tag."""
    found = LINUX_TAG.match(platform)
    if not found:
        raise SystemExit(f"wheelhouse: only Linux platform tags are supported, not {platform!r}")
    full = python if python.count(".") >= 2 else f"{python}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": found[1],
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(full.split(".")[:2]),
        "sys_platform": "linux",
    }


def read_installed(path: Path) -> dict[str, str | None]:
    """Normalized name -> version (None when unknown) of a ``pip freeze``-like file."""
    installed: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+))?", line)
        if found and not line.startswith("-"):
            installed[normalize(found[1])] = found[2]
    return installed


def wheel_requirements(wheel: Path) -> tuple[str, list[Requirement]]:
    """Normalized name and ``Requires-Dist`` of a built wheel: its dependencies and extras as pip sees them."""
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(whl.read(name).decode())
    return normalize(metadata["Name"]), [Requirement(spec) for spec in metadata.get_all("Requires-Dist") or []]


def required(
    name: str, requires: Iterable[Requirement], extras: Iterable[str], env: dict[str, str]
) -> list[Requirement]:
    """What ``name[extras]`` requires on the target (markers evaluated in ``env``), its own dependencies
    included; an extra that names the project's other extras (``name[a,b]``) is followed."""
    found: dict[str, Requirement] = {}
    todo, done = ["", *extras], set()
    while todo:
        extra = normalize(todo.pop())
        if extra in done:
            continue
        done.add(extra)
        for req in requires:
            if req.marker is None or req.marker.evaluate({**env, "extra": extra}):
                if normalize(req.name) == name:
                    todo += req.extras
                else:
                    found.setdefault(str(req), req)
    return list(found.values())


def build_local(root: Path, wheelhouse: Path, extras: str, env: dict[str, str]) -> None:
    """perfsuite, and the source-only engines that ``perfsuite[EXTRAS]`` (``extras``, comma-separated)
    requires on the target (built apart: the folder may hold a previous run's downloads, binary wheels among
    them)."""
    with tempfile.TemporaryDirectory() as tmp:
        pip("wheel", "--no-deps", "-q", "-w", tmp, str(root))
        (own,) = Path(tmp).glob("*.whl")
        name, requires = wheel_requirements(own)
        wanted = [extra for extra in extras.split(",") if extra]
        engines = [
            f"{req.name}{req.specifier}"
            for req in required(name, requires, wanted, env)
            if normalize(req.name) in SOURCE_ONLY
        ]
        if engines:
            pip("wheel", "--no-deps", "-q", "-w", tmp, *engines)
        built = list(Path(tmp).glob("*.whl"))
        impure = [w.name for w in built if not w.name.endswith("-none-any.whl")]
        if impure:
            raise SystemExit(f"wheelhouse: these built wheels are not pure Python, build them on the target: {impure}")
        for wheel in built:
            shutil.move(wheel, wheelhouse / wheel.name)


def resolve(
    wheelhouse: Path, requirements: list[str], flags: list[str], env: dict[str, str], pins: list[str]
) -> list[Item]:
    """pip's report of what installing ``requirements`` on the target takes, ``pins`` as constraints."""
    with tempfile.TemporaryDirectory() as tmp:
        report, constraints = Path(tmp) / "report.json", Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{pin}\n" for pin in pins))
        pip(
            "install",
            "-q",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
            "--target",
            tmp,
            "--find-links",
            str(wheelhouse),
            "-c",
            str(constraints),
            *flags,
            *requirements,
            environment=env,
        )
        install: list[Item] = json.loads(report.read_text())["install"]
    return install


def runner_stack(items: Iterable[Item], env: dict[str, str]) -> set[str]:
    """torch and every resolved package that the requested ones reach only through torch.

    Each package's ``requires_dist`` is followed with its markers evaluated for
    the target and the extras asked of it on the way; torch is not entered.
    Whatever stays unreached comes with the runner's torch.
    """
    by_name = {normalize(item["metadata"]["name"]): item for item in items}
    if RUNNER not in by_name or by_name[RUNNER].get("requested"):
        return set()
    extras: dict[str, set[str]] = {}
    todo = [(name, set(item.get("requested_extras") or ())) for name, item in by_name.items() if item.get("requested")]
    while todo:
        name, wanted = todo.pop()
        if name == RUNNER or name not in by_name or (name in extras and wanted <= extras[name]):
            continue
        extras[name] = extras.get(name, set()) | wanted
        for spec in by_name[name]["metadata"].get("requires_dist", []):
            req = Requirement(spec)
            contexts = [{**env, "extra": extra} for extra in {"", *extras[name]}]
            if req.marker is None or any(req.marker.evaluate(context) for context in contexts):
                todo.append((normalize(req.name), set(req.extras)))
    return set(by_name) - set(extras)


def wheel_key(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file name."""
    name, version = filename.split("-")[:2]
    return normalize(name), str(Version(version))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("wheelhouse", type=Path, help="folder to fill")
    parser.add_argument("--python", default=f"{sys.version_info[0]}.{sys.version_info[1]}", help="target Python X.Y")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="target platform tag")
    parser.add_argument("--extras", default=EXTRAS, help=f"perfsuite's extras, as pyproject.toml names them ({EXTRAS})")
    parser.add_argument("--with-torch", metavar="SPEC", help="also collect torch (machines without their own)")
    parser.add_argument(
        "--exclude-installed", metavar="FILE", type=Path, help="leave out what the target has (pip freeze)"
    )
    parser.add_argument("--max-mib", type=float, help="fail when the wheels weigh more than this")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="perfsuite checkout")
    ns = parser.parse_args(argv)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if ".".join(ns.python.split(".")[:2]) != here and Version(pip_package.__version__) < Version(CROSS_PIP):
        raise SystemExit(
            f"wheelhouse: a wheelhouse for Python {ns.python} built on {here} needs pip>={CROSS_PIP}, this is {pip_package.__version__}"
        )
    ns.wheelhouse.mkdir(parents=True, exist_ok=True)
    flags, env = platform_flags(ns.python, ns.platform), target_environment(ns.python, ns.platform)
    installed = read_installed(ns.exclude_installed) if ns.exclude_installed else {}
    # A local version (2.11.0+cu130) is not on the index; its public version is.
    pins = sorted(f"{name}=={version.split('+')[0]}" for name, version in installed.items() if version)
    build_local(ns.root, ns.wheelhouse, ns.extras, env)
    requirements = [
        f"perfsuite[{ns.extras}]" if ns.extras else "perfsuite",
        BUILD_BACKEND,
        *([ns.with_torch] if ns.with_torch else []),
    ]
    items = resolve(ns.wheelhouse, requirements, flags, env, pins)
    stack = runner_stack(items, env)
    local_uri = ns.wheelhouse.resolve().as_uri()
    kept = [item for item in items if normalize(item["metadata"]["name"]) not in stack | set(installed)]
    pinned = sorted(
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in kept
        if not item["download_info"]["url"].startswith(local_uri)
    )
    if pinned:
        pip("download", "-q", "--no-deps", "-d", str(ns.wheelhouse), *flags, *pinned)
    (ns.wheelhouse / "requirements.txt").write_text("".join(f"{pin}\n" for pin in pinned))
    # Wheels of an earlier run, or built here but provided by the target, go.
    wanted = {(normalize(item["metadata"]["name"]), str(Version(item["metadata"]["version"]))) for item in kept}
    for stale in (w for w in ns.wheelhouse.glob("*.whl") if wheel_key(w.name) not in wanted):
        stale.unlink()
    wheels = sorted(ns.wheelhouse.glob("*.whl"))
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"left out, the runner's torch stack: {' '.join(sorted(stack)) or '-'}")
    print(
        f"left out, installed on the target: {' '.join(sorted(set(installed) & {normalize(i['metadata']['name']) for i in items})) or '-'}"
    )
    print(f"wheelhouse {ns.wheelhouse}: {len(wheels)} wheels, {mib:.1f} MiB, for Python {ns.python} on {ns.platform}")
    if ns.max_mib is not None and mib > ns.max_mib:
        largest = ", ".join(
            f"{w.name} ({w.stat().st_size / 2**20:.1f} MiB)"
            for w in sorted(wheels, key=lambda w: -w.stat().st_size)[:5]
        )
        raise SystemExit(f"wheelhouse: {mib:.1f} MiB is over the {ns.max_mib:g} MiB limit; largest: {largest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
