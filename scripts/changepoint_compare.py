"""Compare change-point detectors on perfsuite-like metric histories (docs/design/changepoint.md).

Detectors: perfsuite's own e-divisive (``perfsuite/reports/exports/changepoint.py``),
MongoDB's ``signal-processing-algorithms`` (SPA) and Apache Otava. The two
libraries cannot be installed beside perfsuite's stack (their numpy pins), so
each runs in a virtual environment of its own under ``--venvs`` (created on the
first run, from the package index), in a worker subprocess that reads the
series as JSON on stdin and writes what it found, with the time each series
took, on stdout.

Series: the three of tests/test_history.py, and seeded synthetic ones (one
step of 10/20/40% or two steps or none, in Gaussian noise of CV 5/10/15%,
10 to 60 points). A found change point matches a true one within +-1 index.

``--deps`` adds each library's dependency weight: its metadata, whether it
resolves for Python 3.10/3.11/3.12 (manylinux_2_28_x86_64 wheels, as
``make wheelhouse``), with the GPU image's pins (``make gpu-kit``) and with
this interpreter's numpy/scipy, and the size of the wheels it pulls in.

    python scripts/changepoint_compare.py [--deps] [--venvs build/changepoint-venvs]

Standard library only in this process (the workers import numpy and the detector).
"""

from __future__ import annotations

import argparse
import email.message
import email.parser
import importlib.util
import itertools
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = {"spa": "signal-processing-algorithms==2.1.6", "otava": "apache-otava==0.8.0"}
#: name -> (venv holding its library, or None for this interpreter; what it runs)
DETECTORS: dict[str, tuple[str | None, str]] = {
    "perfsuite": (None, "perfsuite e_divisive(max_p=0.01, permutations=499, min_size=3), as `history` runs it"),
    "spa": ("spa", "SPA e_divisive(pvalue=0.01, permutations=499): perfsuite's settings"),
    "spa-defaults": ("spa", "SPA e_divisive() with its defaults (pvalue=0.05, permutations=100)"),
    "otava": (
        "otava",
        "Otava compute_change_points() with `otava analyze` defaults (window 50, max_pvalue=0.001, t-test)",
    ),
    "otava-0.01": ("otava", "Otava compute_change_points(max_pvalue=0.01): perfsuite's p"),
    "otava-perm": (
        "otava",
        "Otava compute_change_points_orig(max_pvalue=0.01, seed=0): permutation test, 100 permutations",
    ),
}
TARGETS = ("3.10", "3.11", "3.12")
PLATFORM = "manylinux_2_28_x86_64"


@dataclass(frozen=True)
class Series:
    kind: str  # history-test, one-step, two-step, no-step
    label: str
    values: list[float]
    truth: list[int]  # indices of the first point after each change
    step: float = 0.0  # relative size of the step(s)
    cv: float = 0.0


# -- series ---------------------------------------------------------------------------------------------
def history_test_series() -> list[Series]:
    """The series of tests/test_history.py, generated the same way."""
    rng = random.Random(3)
    step = [rng.gauss(100, 2) for _ in range(20)] + [rng.gauss(85, 2) for _ in range(20)]
    rng = random.Random(11)
    flat = [rng.gauss(100, 2) for _ in range(40)]
    rng = random.Random(5)
    two = [rng.gauss(100, 2) for _ in range(15)] + [rng.gauss(80, 2) for _ in range(15)]
    two += [rng.gauss(95, 2) for _ in range(15)]
    return [
        Series("history-test", "step_history(): 100 -> 85 at 20 of 40", step, [20], 0.15, 0.02),
        Series("history-test", "no step: 40 points near 100", flat, [], 0.0, 0.02),
        Series("history-test", "two steps: 100 -> 80 -> 95 at 15, 30 of 45", two, [15, 30], 0.2, 0.02),
    ]


def noisy(rng: random.Random, level: float, cv: float, n: int) -> list[float]:
    return [rng.gauss(level, cv * level) for _ in range(n)]


def synthetic_series() -> list[Series]:
    out: list[Series] = []
    cvs, steps = (0.05, 0.10, 0.15), (0.10, 0.20, 0.40)
    for n in (10, 20, 30, 40, 60):
        for cv in cvs:
            for step in steps:
                for seed in range(3):
                    rng = random.Random(f"one/{n}/{cv}/{step}/{seed}")
                    at = rng.randint(max(3, n // 4), min(n - 3, 3 * n // 4))
                    after = 100 * (1 - step if seed % 2 == 0 else 1 + step)
                    values = noisy(rng, 100, cv, at) + noisy(rng, after, cv, n - at)
                    out.append(Series("one-step", f"n={n} cv={cv} step={step} seed={seed}", values, [at], step, cv))
    for n in (20, 30, 40, 60):
        for cv in cvs:
            for step in steps:
                for seed in range(3):
                    rng = random.Random(f"two/{n}/{cv}/{step}/{seed}")
                    a, b = n // 3, 2 * n // 3
                    middle = 100 * (1 - step)
                    last = 100 if seed % 2 == 0 else middle * (1 - step)  # fixed again, or a second regression
                    values = noisy(rng, 100, cv, a) + noisy(rng, middle, cv, b - a) + noisy(rng, last, cv, n - b)
                    out.append(Series("two-step", f"n={n} cv={cv} step={step} seed={seed}", values, [a, b], step, cv))
    for n in (10, 20, 30, 40, 60):
        for cv in cvs:
            for seed in range(10):
                rng = random.Random(f"none/{n}/{cv}/{seed}")
                out.append(Series("no-step", f"n={n} cv={cv} seed={seed}", noisy(rng, 100, cv, n), [], 0.0, cv))
    return out


# -- workers (run in the detector's environment) --------------------------------------------------------
def detector(name: str) -> Callable[[list[float]], list[int]]:
    """The detector as values -> sorted change-point indices; imports only what it needs."""
    if name == "perfsuite":
        # The module file itself: importing the perfsuite package would load torch.
        spec = importlib.util.spec_from_file_location("changepoint", ROOT / "perfsuite/reports/exports/changepoint.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["changepoint"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return lambda values: [s.index for s in module.e_divisive(values)]
    if name.startswith("spa"):
        import numpy as np
        from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

        kwargs: dict[str, Any] = {} if name == "spa-defaults" else {"pvalue": 0.01, "permutations": 499}

        def spa(values: list[float]) -> list[int]:
            np.random.seed(0)  # its permutations draw from numpy's global generator
            return sorted(int(i) for i in e_divisive(values, **kwargs))

        return spa
    from otava.analysis import compute_change_points, compute_change_points_orig

    if name == "otava-perm":
        return lambda values: sorted(cp.index for cp in compute_change_points_orig(values, max_pvalue=0.01, seed=0)[0])
    p = {"otava": 0.001, "otava-0.01": 0.01}[name]
    return lambda values: sorted(cp.index for cp in compute_change_points(values, max_pvalue=p)[0])


def worker(name: str) -> None:
    find = detector(name)
    results = []
    for values in json.load(sys.stdin):
        start = time.perf_counter()
        found = [int(i) for i in find(values)]
        results.append({"found": found, "seconds": time.perf_counter() - start})
    json.dump(results, sys.stdout)


# -- running --------------------------------------------------------------------------------------------
def venv_python(venvs: Path, venv: str) -> Path:
    """The venv's interpreter, creating the venv with its library pinned when missing."""
    python = venvs / venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venvs / venv} with {LIBRARIES[venv]} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venvs / venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LIBRARIES[venv]], check=True)
    return python


@dataclass
class Score:
    series: int = 0
    true: int = 0
    near: int = 0  # true change points found within +-1
    exact: int = 0
    false: int = 0  # found points matching no true one
    series_with_false: int = 0
    all_found: int = 0  # series whose every true point was found within +-1, and nothing else
    seconds: list[float] = field(default_factory=list)

    def add(self, truth: Sequence[int], found: Sequence[int], seconds: float) -> None:
        left = list(found)
        near = 0
        for t in truth:  # one found point per true one, the closest
            close = sorted((abs(f - t), f) for f in left if abs(f - t) <= 1)
            if close:
                left.remove(close[0][1])
                near += 1
        self.series += 1
        self.true += len(truth)
        self.near += near
        self.exact += len(set(truth) & set(found))
        self.false += len(left)
        self.series_with_false += bool(left)
        self.all_found += near == len(truth) and not left
        self.seconds.append(seconds)


def run(names: Sequence[str], venvs: Path, all_series: list[Series]) -> dict[str, list[dict[str, Any]]]:
    payload = json.dumps([s.values for s in all_series])
    out: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        venv = DETECTORS[name][0]
        python = Path(sys.executable) if venv is None else venv_python(venvs, venv)
        print(f"running {name} on {len(all_series)} series ...", file=sys.stderr, flush=True)
        done = subprocess.run(
            [str(python), __file__, "--worker", name], input=payload, capture_output=True, text=True, check=False
        )
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr}")
        out[name] = json.loads(done.stdout)
    return out


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "-"


def sort_key(kind: str) -> tuple[int, str, float]:
    """one-step, two-step, no-step; the kind, then its steps, then its CVs, by size."""
    words = kind.split()
    order = ["one-step", "two-step", "no-step", "all"].index(words[0])
    number = float(words[-1].rstrip("%")) if words[-1].endswith("%") else -1.0
    return order, words[1] if len(words) == 3 else "", number


def report(names: Sequence[str], all_series: list[Series], results: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["## History-test series (tests/test_history.py)", ""]
    tests = [i for i, s in enumerate(all_series) if s.kind == "history-test"]
    lines += ["| detector | " + " | ".join(all_series[i].label for i in tests) + " |"]
    lines += ["|---" * (len(tests) + 1) + "|"]
    for name in names:
        cells = []
        for i in tests:
            found, truth = results[name][i]["found"], all_series[i].truth
            cells.append(f"{found} {'ok' if found == truth else 'WRONG (true ' + str(truth) + ')'}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    scores: dict[tuple[str, str], Score] = {}
    for name in names:
        for s, r in zip(all_series, results[name], strict=True):
            if s.kind == "history-test":
                continue
            keys = [s.kind, f"{s.kind} {s.step:.0%}" if s.step else f"{s.kind} cv {s.cv:.0%}", "all synthetic"]
            if s.kind != "no-step":
                keys.append(f"{s.kind} cv {s.cv:.0%}")
            for key in keys:
                scores.setdefault((name, key), Score()).add(s.truth, r["found"], r["seconds"])
    kinds = sorted({k for _, k in scores}, key=sort_key)
    counts = {k: scores[(names[0], k)].series for k in kinds}
    lines += ["", "## Synthetic series: true change points found within +-1 index (exact in brackets)", ""]
    step_kinds = [k for k in kinds if k.startswith(("one-step", "two-step"))]
    lines += ["| detector | " + " | ".join(f"{k} (n={counts[k]})" for k in step_kinds) + " |"]
    lines += ["|---" * (len(step_kinds) + 1) + "|"]
    for name in names:
        cells = [
            f"{pct(scores[(name, k)].near, scores[(name, k)].true)} [{scores[(name, k)].exact}]" for k in step_kinds
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## False positives", ""]
    fp_kinds = [k for k in kinds if k.startswith("no-step")] + ["one-step", "two-step"]
    lines += ["| detector | " + " | ".join(f"{k}: series with any (n={counts[k]})" for k in fp_kinds) + " |"]
    lines += ["|---" * (len(fp_kinds) + 1) + "|"]
    for name in names:
        cells = [
            f"{pct(scores[(name, k)].series_with_false, scores[(name, k)].series)}, {scores[(name, k)].false} points"
            for k in fp_kinds
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Whole series right, and runtime", ""]
    lines += [
        "| detector | series exactly right (+-1, no extra) | total s | median ms/series | max ms | what it runs |"
    ]
    lines += ["|---|---|---|---|---|---|"]
    for name in names:
        total = scores[(name, "all synthetic")]
        secs = total.seconds
        lines.append(
            f"| {name} | {pct(total.all_found, total.series)} | {sum(secs):.1f} | {1000 * statistics.median(secs):.1f} "
            f"| {1000 * max(secs):.0f} | {DETECTORS[name][1]} |"
        )
    return "\n".join(lines)


# -- dependency weight ----------------------------------------------------------------------------------
def metadata(requirement: str, where: Path) -> tuple[str, email.message.Message, bool]:
    """The distribution file pip would take, its core metadata, and whether it holds C sources."""
    pip_quiet("download", "--no-deps", "-d", str(where), requirement)
    (path,) = where.iterdir()
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            text = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    else:
        with tarfile.open(path) as sdist:
            names = sdist.getnames()
            member = sdist.extractfile(next(n for n in names if n.count("/") == 1 and n.endswith("/PKG-INFO")))
            assert member is not None
            text = member.read().decode()
    compiled = any(n.endswith((".c", ".cpp", ".pyx", ".so")) for n in names)
    return path.name, email.parser.Parser().parsestr(text), compiled


def pip_quiet(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, capture_output=True)


def resolve(requirements: list[str], python: str, pins: list[str]) -> tuple[list[str] | None, str]:
    """Names==versions pip resolves for ``python`` on PLATFORM (None and pip's reason when it cannot)."""
    from wheelhouse import PIP_FOR_TARGET, platform_flags, target_environment

    env = target_environment(python, PLATFORM)
    with tempfile.TemporaryDirectory() as tmp:
        report_path, constraints = Path(tmp) / "report.json", Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{pin}\n" for pin in pins))
        cmd = [sys.executable, "-c", PIP_FOR_TARGET, json.dumps(env), "install", "--dry-run"]
        cmd += ["--ignore-installed", "--report", str(report_path), "--target", tmp, "-c", str(constraints)]
        done = subprocess.run(
            [*cmd, *platform_flags(python, PLATFORM), *requirements], capture_output=True, text=True, check=False
        )
        if done.returncode:
            return None, conflict(done.stdout + "\n" + done.stderr)
        items = json.loads(report_path.read_text())["install"]
    return sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items), ""


def conflict(output: str) -> str:
    """pip's reason, short: the requirements in conflict, else its first error."""
    lines = [line.strip() for line in output.splitlines()]
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        causes = list(itertools.takewhile(bool, lines[start:]))
        return "; ".join(dict.fromkeys(c.replace("The user requested (constraint)", "pin") for c in causes))
    errors = [line for line in lines if line.startswith("ERROR") and "Ignored the following" not in line]
    return (errors[0] if errors else output.strip()[-200:])[:200]


def wheel_mib(pins: list[str], python: str, cache: Path) -> tuple[float, float]:
    """MiB of the wheels of ``pins`` for ``python``, and of those the GPU image lacks (at that version)."""
    from wheelhouse import normalize, platform_flags, read_installed

    folder = cache / python
    folder.mkdir(parents=True, exist_ok=True)
    pip_quiet("download", "--no-deps", "-d", str(folder), *platform_flags(python, PLATFORM), *pins)
    image = read_installed(ROOT / "scripts/gpu-image-constraints.txt")
    wanted = {normalize(p.split("==")[0]): p.split("==")[1] for p in pins}
    total = beyond = 0.0
    for wheel in folder.glob("*.whl"):
        name, version = normalize(wheel.name.split("-")[0]), wheel.name.split("-")[1]
        if wanted.get(name) != version:
            continue
        total += wheel.stat().st_size
        beyond += 0 if image.get(name) == version else wheel.stat().st_size
    return total / 2**20, beyond / 2**20


def dependencies(cache: Path) -> str:
    """Markdown: each library's metadata and what installing it takes on each target."""
    import importlib.metadata

    sys.path.insert(0, str(ROOT / "scripts"))
    from pip._vendor.packaging.specifiers import SpecifierSet
    from wheelhouse import read_installed

    image_pins = [f"{n}=={v}" for n, v in read_installed(ROOT / "scripts/gpu-image-constraints.txt").items() if v]
    here = [f"{n}=={importlib.metadata.version(n)}" for n in ("numpy", "scipy", "setuptools")]
    lines = ["## Dependencies", ""]
    for lib, requirement in LIBRARIES.items():
        with tempfile.TemporaryDirectory() as tmp:
            filename, meta, compiled = metadata(requirement, Path(tmp))
            built = ""
            if not filename.endswith(".whl"):  # what building it here gives
                pip_quiet("wheel", "--no-deps", "-w", tmp, str(Path(tmp) / filename))
                built = next(p.name for p in Path(tmp).glob("*.whl"))
        runtime = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
        requires_python = SpecifierSet(meta.get("Requires-Python") or "")
        lines += [f"### {requirement} ({lib})", ""]
        lines += [f"- on the index: `{filename}`" + (" (C sources inside)" if compiled else "")]
        if built:
            lines += [f"- built here (gcc present): `{built}`"]
        lines += [f"- Requires-Python: `{requires_python}`"]
        lines += [f"- Requires-Dist ({len(runtime)}): " + ", ".join(f"`{r}`" for r in runtime)]
        # An sdist cannot be resolved for another platform: resolve what it requires.
        wants = [requirement] if filename.endswith(".whl") else [r.replace(" (", "").replace(")", "") for r in runtime]
        lines += [
            "",
            f"| target | resolves alone | packages | wheels MiB | MiB the GPU image lacks | with the GPU image's pins | with this venv's {', '.join(here)} |",
        ]
        lines += ["|---|---|---|---|---|---|---|"]
        for python in TARGETS:
            if not requires_python.contains(f"{python}.0"):
                lines.append(f"| Python {python} | no: Requires-Python `{requires_python}` | | | | | |")
                continue
            pins, error = resolve(wants, python, [])
            if pins is None:
                lines.append(f"| Python {python} | no: {error} | | | | | |")
                continue
            total, beyond = wheel_mib(pins, python, cache / lib)
            image, image_error = resolve(wants, python, image_pins) if python == "3.12" else (None, "")
            venv, venv_error = resolve(wants, python, here)
            image_cell = "yes" if image else f"no: {image_error}" if image_error else "- (image: 3.12)"
            lines.append(
                f"| Python {python} | yes | {len(pins) + (0 if filename.endswith('.whl') else 1)} | {total:.1f} "
                f"| {beyond:.1f} | {image_cell} | {'yes' if venv else 'no: ' + venv_error} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--venvs", type=Path, default=ROOT / "build/changepoint-venvs", help="the libraries' venvs")
    parser.add_argument("--detectors", default=",".join(DETECTORS), help="comma-separated, of: " + ", ".join(DETECTORS))
    parser.add_argument("--deps", action="store_true", help="also resolve and weigh each library's dependencies")
    parser.add_argument("--worker", choices=list(DETECTORS), help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        worker(ns.worker)
        return 0
    names = [n for n in ns.detectors.split(",") if n]
    unknown = set(names) - set(DETECTORS)
    if unknown:
        parser.error(f"unknown detectors {sorted(unknown)}")
    all_series = history_test_series() + synthetic_series()
    print(report(names, all_series, run(names, ns.venvs, all_series)))
    if ns.deps:
        print()
        print(dependencies(ns.venvs / "wheels"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
