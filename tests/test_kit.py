"""The GPU kit (issue 24, "The kit"): `make gpu-kit` collects what the bare GPU
image (scripts/gpu-image-constraints.txt) lacks. pip cannot be told what a
machine already has, so the image is stood in for by stub wheels, one per
package it lists (name and version only), and pip's resolver, for the image's
Python and platform with no index, must find every GPU extra of perfsuite in
the kit and the stubs. The kit itself keeps out the runner's CUDA stack."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import wheelhouse  # noqa: E402

IMAGE = ROOT / "scripts" / "gpu-image-constraints.txt"
PYTHON, PLATFORM = "3.12", "manylinux_2_28_x86_64"
NETWORK_ERRORS = ("NewConnectionError", "Temporary failure in name resolution", "Could not fetch URL", "timed out")
#: The version of a stub whose image version is not known yet: any lower bound holds.
UNKNOWN = "9999"


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kit")
    # An earlier run's leftover, a binary wheel: not refused as a build of this run's, and pruned.
    stub_wheel(folder, "stale", "1.0", "cp312-cp312-manylinux_2_28_x86_64")
    make = ["make", "-C", str(ROOT), "gpu-kit", f"PYTHON={sys.executable}", f"KIT={folder}"]
    build = subprocess.run(make, capture_output=True, text=True, check=False)
    if build.returncode != 0 and any(e in build.stdout + build.stderr for e in NETWORK_ERRORS):
        pytest.skip(f"building the kit needs the package index, which is unreachable: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    return folder


def kit_extras() -> str:
    """The Makefile's KIT_EXTRAS: the extras `make gpu-kit` collects, as pyproject.toml names them."""
    found = re.search(r"^KIT_EXTRAS \?= (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile sets no KIT_EXTRAS"
    return found[1]


def stub_wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any") -> None:
    """A wheel that installs nothing and says only that ``name`` ``version`` is there."""
    dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-{tag}.whl", "w") as whl:
        whl.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        whl.writestr(f"{dist}.dist-info/RECORD", "")


@pytest.mark.timeout(600)
@pytest.mark.slow  # builds the kit from the index (~30 s); every GPU session builds it first anyway
def test_the_kit_and_the_image_hold_every_gpu_extra(kit: Path, tmp_path: Path) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, version in wheelhouse.read_installed(IMAGE).items():
        stub_wheel(stubs, name, version or UNKNOWN)
    report = tmp_path / "report.json"
    # What `make setup EXTRAS=$(KIT_EXTRAS)` installs there, markers evaluated for Python 3.12 (the megatron
    # extra needs it).
    pip = [sys.executable, "-c", wheelhouse.PIP_FOR_TARGET, json.dumps(wheelhouse.target_environment(PYTHON, PLATFORM))]
    where = ["--target", str(tmp_path / "target"), "--no-index", "--find-links", str(kit), "--find-links", str(stubs)]
    wanted = [f"perfsuite[{kit_extras()}]", wheelhouse.BUILD_BACKEND]
    flags = wheelhouse.platform_flags(PYTHON, PLATFORM)
    resolve = [*pip, "install", "--dry-run", "--ignore-installed", "--report", str(report), *where, *flags, *wanted]
    # No pip configuration: only the two folders.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(resolve, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    installed: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    kit_uri = kit.resolve().as_uri()
    from_kit = {
        wheelhouse.normalize(i["metadata"]["name"]) for i in installed if i["download_info"]["url"].startswith(kit_uri)
    }
    assert {"perfsuite", "deepspeed", "fairscale", "megatron-core"} <= from_kit


@pytest.mark.slow  # builds the kit from the index (~30 s); every GPU session builds it first anyway
def test_the_kit_is_small_and_leaves_the_cuda_stack_to_the_image(kit: Path) -> None:
    wheels = {wheelhouse.wheel_key(w.name)[0]: w for w in kit.glob("*.whl")}
    assert {"perfsuite", "deepspeed", "fairscale", "megatron-core"} <= set(wheels)
    assert "stale" not in wheels
    assert wheels["deepspeed"].name.endswith("-py3-none-any.whl")  # DS_BUILD_OPS=0: no ops built
    runtime = [
        n for n in wheels if n in ("torch", "triton") or (re.match(r"(nvidia|cuda)-", n) and n != "nvidia-ml-py")
    ]
    assert not runtime
    assert sum(w.stat().st_size for w in wheels.values()) <= 40 * 2**20


def item(name: str, requires: list[str], requested: bool = False, extras: list[str] | None = None) -> dict[str, Any]:
    """One entry of pip's ``--report`` install list."""
    entry = {"metadata": {"name": name, "version": "1", "requires_dist": requires}, "requested": requested}
    return {**entry, "requested_extras": extras} if extras else entry


def test_the_runner_stack_is_what_only_torch_requires() -> None:
    cuda = 'platform_system == "Linux"'
    report = [
        item(
            "perfsuite",
            ["torch>=2.4", "nvidia-ml-py>=12", "filelock", 'deepspeed; extra == "deepspeed"'],
            True,
            ["deepspeed"],
        ),
        item(
            "torch", ["filelock", "sympy", f"triton; {cuda}", f"nvidia-cublas; {cuda}", f"cuda-toolkit[nvrtc]; {cuda}"]
        ),
        item("deepspeed", ["torch", "einops", 'triton; extra == "sd"']),
        item("cuda-toolkit", ['nvidia-cuda-nvrtc; extra == "nvrtc"']),
        *(
            item(name, [])
            for name in ("nvidia-ml-py", "filelock", "sympy", "triton", "nvidia-cublas", "nvidia-cuda-nvrtc", "einops")
        ),
    ]
    stack = wheelhouse.runner_stack(report, wheelhouse.target_environment(PYTHON, PLATFORM))
    assert stack == {"torch", "triton", "nvidia-cublas", "cuda-toolkit", "nvidia-cuda-nvrtc", "sympy"}
    # --with-torch: torch was asked for, so nothing is left out.
    with_torch = [item("perfsuite", ["torch"], True), item("torch", [f"triton; {cuda}"], True), item("triton", [])]
    assert wheelhouse.runner_stack(with_torch, wheelhouse.target_environment(PYTHON, PLATFORM)) == set()
