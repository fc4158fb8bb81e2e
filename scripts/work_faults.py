"""Planted faults against the work gate (issue 56), in a repository made by ``perfsuite init``.

    python scripts/work_faults.py DIR RUNS [SETUP]

Makes DIR (``perfsuite init``, its row at world size 2), records its baselines, then runs the gate
RUNS times on unchanged code and RUNS times with each of the setup's planted faults, and prints
each run's verdict and the first words of its message. SETUP:

* ``example`` (default): ``init``'s example model with an AdamW factory of the team's own;
  faults ``item`` (a ``.item()`` in every block's forward: a host sync), ``foreach`` (AdamW with
  ``foreach=False``: one kernel per parameter), ``allreduce`` (an extra all-reduce of a scalar in
  the forward);
* ``gpt``: a small causal GPT of the team's own in bf16 (autocast), attention through SDPA;
  faults ``sdpa`` (attention written out: matmuls, mask, softmax) and ``upcast`` (the logits
  turned to float32 before the loss);
* ``gpt-compile``: the same GPT, its row compiled (torch.compile, inductor); fault ``graphbreak``
  (``torch._dynamo.graph_break()`` in every block).

docs/lab/work-counts.md has what it printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FACTORY = """

def adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, foreach=True)
"""
BLOCK_RETURN = "        return x + self.mlp(self.norm(x))"

GPT = '''"""A small causal GPT, the team's own: attention through SDPA."""

import torch
import torch.nn.functional as F
from torch import nn

from perfsuite import Recipe


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        rows, seq, width = x.shape
        q, k, v = (t.view(rows, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(rows, seq, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return logits


def build(device, dtype, vocab: int = 2048, width: int = 128, depth: int = 2, heads: int = 4, seq: int = 128) -> Recipe:
    model = GPT(vocab, width, depth, heads, seq).to(device=device, dtype=dtype)

    def batch(rows: int, seq_len: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (rows, seq_len + 1), generator=gen)
        return {"ids": ids[:, :-1], "targets": ids[:, 1:]}

    def loss(logits: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["targets"].reshape(-1))

    return Recipe(model, batch, loss=loss, inputs=("ids",))
'''
MANUAL_ATTENTION = """        scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v"""
GPT_ROW = 'MODEL = ModelSpec.module("perf_models.gpt:build")'


@dataclass(frozen=True)
class Setup:
    """A repository's model and row, and the faults planted in one of its files."""

    target: str
    """The file the faults edit, under the repository."""
    faults: dict[str, tuple[str, str]]
    """Fault -> (text, its replacement)."""
    files: dict[str, str] = field(default_factory=dict)
    """Files written beside init's, by path."""
    appended: str = ""
    """Text added to the target."""
    bench: tuple[tuple[str, str], ...] = ()
    """Replacements in the bench file: the row's model, precision, graph."""


SETUPS = {
    "example": Setup(
        "perf_models/example.py",
        {
            "item": (BLOCK_RETURN, "        x.sum().item()\n" + BLOCK_RETURN),
            "foreach": ("foreach=True", "foreach=False"),
            "allreduce": (BLOCK_RETURN, "        torch.distributed.all_reduce(x.detach().sum())\n" + BLOCK_RETURN),
        },
        appended=FACTORY,
        bench=(('strategy="ddp",', 'strategy="ddp", strategy_options={"optimizer": "perf_models.example:adamw"},'),),
    ),
    "gpt": Setup(
        "perf_models/gpt.py",
        {
            "sdpa": ("        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)", MANUAL_ATTENTION),
            "upcast": ("        logits = self.head(self.norm(x))", "        logits = self.head(self.norm(x)).float()"),
        },
        files={"perf_models/gpt.py": GPT},
        bench=(("MODEL = ", GPT_ROW + "\n_INIT_MODEL = "), ('strategy="ddp",', 'strategy="ddp", precision="bf16",')),
    ),
    "gpt-compile": Setup(
        "perf_models/gpt.py",
        {
            "graphbreak": (
                "        x = x + self.attend",
                "        torch._dynamo.graph_break()\n        x = x + self.attend",
            )
        },
        files={"perf_models/gpt.py": GPT},
        bench=(
            ("MODEL = ", GPT_ROW + "\n_INIT_MODEL = "),
            ('strategy="ddp",', 'strategy="ddp", precision="bf16", graph="compile",'),
        ),
    ),
}


def run(repo: Path, *args: str) -> dict:
    out = repo / "gate.json"
    argv = [sys.executable, "-m", "pytest", "bench_tests", "-q", "-p", "no:cacheprovider", "--perf-op-profiles=off"]
    subprocess.run([*argv, f"--perf-json={out}", "--perf-allow-unjudged", *args], cwd=repo, capture_output=True)
    return json.loads(out.read_text())["results"][0]


def make(repo: Path, setup: Setup) -> Path:
    """The repository, its model and row as ``setup`` says; the file the faults edit."""
    repo.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "perfsuite", "init"], cwd=repo, check=True, capture_output=True)
    for path, text in setup.files.items():
        (repo / path).write_text(text)
    target = repo / setup.target
    target.write_text(target.read_text() + setup.appended)
    bench = next((repo / "bench_tests").glob("test_*.py"))
    text = bench.read_text()
    for old, new in setup.bench:
        assert old in text, old
        text = text.replace(old, new, 1)
    bench.write_text(text)
    return target


def main(repo: Path, runs: int, name: str) -> None:
    setup = SETUPS[name]
    target = make(repo, setup)
    recorded = run(repo, "--perf-update-baselines")
    count = recorded["work"]["count"]
    print(
        f"recorded: {recorded['verdict']}, work {count and sum(count['ops'].values())} calls, {recorded['message'][:200]}"
    )
    clean = target.read_text()
    for fault in ("none", *setup.faults):
        if fault != "none":
            old, new = setup.faults[fault]
            assert old in clean, fault
            target.write_text(clean.replace(old, new))
        verdicts: Counter[str] = Counter()
        for i in range(runs):
            result = run(repo)
            verdicts[result["verdict"]] += 1
            print(f"{fault} {i + 1}: {result['verdict']}: {result['work']['message'][:200]}", flush=True)
        print(f"== {fault}: {dict(verdicts)}", flush=True)
        target.write_text(clean)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "example")
