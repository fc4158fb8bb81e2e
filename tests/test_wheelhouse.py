"""Air-gapped install (issue: GPU runners for real): a wheelhouse built by
scripts/wheelhouse.py installs the project into a fresh venv with pip's
--no-index, nothing fetched. Built for this machine's Python and platform, with
the local CPU torch, so the installed project can be imported and run."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
NETWORK_ERRORS = ("NewConnectionError", "Temporary failure in name resolution", "Could not fetch URL", "timed out")


def offline_env() -> dict[str, str]:
    """No pip configuration at all: only the wheelhouse given on the command line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.timeout(1200)
def test_the_project_installs_from_a_wheelhouse_with_no_index(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    platform = "manylinux_2_28_" + sysconfig.get_platform().split("-")[-1]
    build = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "wheelhouse.py"),
            str(wheels),
            "--platform",
            platform,
            "--extras",
            "",
            "--with-torch",
            "torch==2.13.0",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0 and any(e in build.stderr for e in NETWORK_ERRORS):
        pytest.skip(f"building the wheelhouse needs the package index, which is unreachable: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    names = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    assert {"perfsuite", "torch", "transformers", "scipy", "setuptools"} <= names
    assert not {"deepspeed", "fairscale"} & names  # their extras were not asked for

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling torch and transformers is 20 s of CPU that says nothing about the wheelhouse.
    pip_install = [str(python), "-m", "pip", "install", "-q", "--no-compile"]
    install = subprocess.run(
        [*pip_install, "--no-index", "--find-links", str(wheels), "perfsuite"],
        capture_output=True,
        text=True,
        check=False,
        env=offline_env(),
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    check = subprocess.run(
        [str(python), "-c", "import perfsuite.plugin, torch, transformers, scipy; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=False,
        env=offline_env(),
        cwd=tmp_path,
    )
    assert check.returncode == 0 and check.stdout.strip().startswith("2.13.0"), check.stderr[-2000:]
