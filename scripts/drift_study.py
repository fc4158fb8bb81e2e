"""Does a same-session reference follow this machine's drift? (issue 26, item 6)

Reads results files of whole-suite runs (``--perf-json``) taken at different
times on one machine and, for every scenario judged by samples/s in all of
them, compares how far raw samples/s moved between runs with how far two
same-session ratios moved:

* ``ceiling``: samples/s divided by the session's measured best matmul of the
  scenario's precision (``ceilings`` in the results file; fp32 where the
  session measured no other);
* ``vector``: samples/s divided by the session's ``microbench.vector_mul``
  TFLOP/s (a memory-bound step of the same session).

A reference that follows the drift keeps its ratio within +-10% while raw
samples/s moves by tens of percent.

    python scripts/drift_study.py docs/lab/drift/*.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    """A results file, plain or gzipped (docs/lab/drift/ keeps them gzipped)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return dict(json.loads(raw))


def samples_per_s(result: Mapping[str, Any]) -> float | None:
    found = (result.get("metrics") or {}).get("samples_per_s")
    return float(found["mean"]) if isinstance(found, Mapping) and result.get("status") == "ok" else None


def ceiling(document: Mapping[str, Any], precision: str) -> float | None:
    ceilings = document.get("ceilings") or {}
    for dtype in (precision, "fp32"):
        if dtype in ceilings:
            return float(ceilings[dtype]["tflops"])
    return None


def vector(document: Mapping[str, Any]) -> float | None:
    for result in document["results"]:
        if result["id"] == "microbench.vector_mul" and result.get("status") == "ok":
            return float(result["metrics"]["tflops"]["mean"])
    return None


def series(documents: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Scenario id -> {raw, ceiling, vector}: one value per run, for scenarios measured in every run."""
    found: dict[str, dict[str, list[float]]] = {}
    for document in documents:
        vec = vector(document)
        for result in document["results"]:
            rate = samples_per_s(result)
            if rate is None:
                continue
            top = ceiling(document, str(result["config"].get("precision", "fp32")))
            row = found.setdefault(result["id"], {"raw": [], "ceiling": [], "vector": []})
            row["raw"].append(rate)
            row["ceiling"].append(rate / top if top else float("nan"))
            row["vector"].append(rate / vec if vec else float("nan"))
    return {k: v for k, v in found.items() if len(v["raw"]) == len(documents)}


def spread(values: Sequence[float]) -> float:
    """max/min - 1: how far the runs moved apart."""
    return max(values) / min(values) - 1 if min(values) > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args()
    documents = [load(p) for p in args.results]
    rows = series(documents)
    print("| scenario | samples/s per run | raw spread | / ceiling spread | / vector_mul spread |")
    print("|---|---|---|---|---|")
    totals: dict[str, list[float]] = {"raw": [], "ceiling": [], "vector": []}
    for sid, row in sorted(rows.items()):
        cells = [spread(row[k]) for k in ("raw", "ceiling", "vector")]
        for key, value in zip(("raw", "ceiling", "vector"), cells, strict=True):
            totals[key].append(value)
        runs = ", ".join(f"{v:.3g}" for v in row["raw"])
        print(f"| {sid} | {runs} | {cells[0]:.0%} | {cells[1]:.0%} | {cells[2]:.0%} |")
    medians = {k: statistics.median(v) for k, v in totals.items() if v}
    print(
        f"\n{len(rows)} scenarios, {len(documents)} runs; median spread: raw {medians.get('raw', 0):.0%}, "
        f"/ ceiling {medians.get('ceiling', 0):.0%}, / vector_mul {medians.get('vector', 0):.0%}"
    )
    for doc, path in zip(documents, args.results, strict=True):
        print(
            f"{path.name}: ceilings {json.dumps({k: round(v['tflops'], 4) for k, v in (doc.get('ceilings') or {}).items()})},"
            f" vector_mul {vector(doc)}"
        )


if __name__ == "__main__":
    main()
