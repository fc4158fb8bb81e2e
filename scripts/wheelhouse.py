"""Collect every wheel ``make bench`` needs, for a GPU node without internet.

Run on a connected machine (``make wheelhouse WHEELHOUSE=DIR``); copy DIR to
the node and run ``make bench WHEELHOUSE=DIR`` there: it installs with pip's
``--no-index --find-links DIR`` and no isolated build, so nothing is fetched.

1. perfsuite itself and the engines PyPI ships only as sources (DeepSpeed,
   fairscale), those whose extra is asked for, are built here into wheels.
   They are pure Python; one that is not is refused, since it would not run
   on another platform.
2. pip resolves ``perfsuite[EXTRAS]`` for the target Python and platform
   (``--dry-run --report``, metadata only) and every resolved package is
   downloaded as a wheel for that target.
3. The runner's own CUDA stack (torch, triton, nvidia-*) is left out: a GPU
   runner keeps its torch, which satisfies perfsuite's ``torch>=2.4``. For a
   machine without torch, ``--with-torch torch==X`` adds it.

Standard library only: it runs with any Python that has pip.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE_ONLY = ("deepspeed", "fairscale")
#: The runner's CUDA stack, never replaced: left out unless --with-torch.
RUNNER_STACK = re.compile(r"^(torch|triton|nvidia-.*)$")
#: Build backend of an editable install without build isolation.
BUILD_BACKEND = "setuptools>=68"


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


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


def build_local(root: Path, wheelhouse: Path, extras: str) -> None:
    """perfsuite, and the source-only engines whose extra is asked for."""
    engines = [name for name in SOURCE_ONLY if name in extras.split(",")]
    pip("wheel", "--no-deps", "-q", "-w", str(wheelhouse), str(root), *engines)
    impure = [w.name for w in wheelhouse.glob("*.whl") if not w.name.endswith("-none-any.whl")]
    if impure:
        raise SystemExit(f"wheelhouse: these built wheels are not pure Python, build them on the target: {impure}")


def resolve(wheelhouse: Path, extras: str, flags: list[str], torch: str | None) -> list[str]:
    """``name==version`` of everything to download for the target."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        requirements = [f"perfsuite[{extras}]" if extras else "perfsuite", BUILD_BACKEND, *([torch] if torch else [])]
        pip("install", "-q", "--dry-run", "--ignore-installed", "--report", str(report), "--target", tmp,
            "--find-links", str(wheelhouse), *flags, *requirements)  # fmt: skip
        resolved = json.loads(report.read_text())["install"]
    pinned = []
    for item in resolved:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        local = item["download_info"]["url"].startswith(wheelhouse.resolve().as_uri())
        if local or (RUNNER_STACK.match(name.lower()) and not torch):
            continue
        pinned.append(f"{name}=={version}")
    return sorted(pinned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheelhouse", type=Path, help="folder to fill")
    parser.add_argument("--python", default=f"{sys.version_info[0]}.{sys.version_info[1]}", help="target Python X.Y")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="target platform tag")
    parser.add_argument("--extras", default="deepspeed,fairscale,test", help="perfsuite extras to include")
    parser.add_argument("--with-torch", metavar="SPEC", help="also collect torch (machines without their own)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="perfsuite checkout")
    ns = parser.parse_args(argv)
    ns.wheelhouse.mkdir(parents=True, exist_ok=True)
    flags = platform_flags(ns.python, ns.platform)
    build_local(ns.root, ns.wheelhouse, ns.extras)
    pinned = resolve(ns.wheelhouse, ns.extras, flags, ns.with_torch)
    pip("download", "-q", "--no-deps", "-d", str(ns.wheelhouse), *flags, *pinned)
    (ns.wheelhouse / "requirements.txt").write_text("\n".join(pinned) + "\n")
    wheels = sorted(p.name for p in ns.wheelhouse.glob("*.whl"))
    print(f"wheelhouse {ns.wheelhouse}: {len(wheels)} wheels for Python {ns.python} on {ns.platform}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
