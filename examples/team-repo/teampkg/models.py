"""The team's model: a small encoder of residual MLP blocks, trained to regress a target."""

import torch
import torch.nn.functional as F
from torch import nn

from perfsuite import Recipe


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Encoder(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))  # FSDP2 shards these one by one
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(device: torch.device, dtype: torch.dtype, width: int = 64, depth: int = 4) -> Recipe:
    model = Encoder(width, depth).to(device=device, dtype=dtype)

    def batch(rows: int, seq_len: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {
            "x": torch.randn(rows, seq_len, width, generator=gen),
            "target": torch.randn(rows, seq_len, width, generator=gen),
        }

    return Recipe(model, batch, loss=lambda out, b: F.mse_loss(out, b["target"]), inputs=("x",))
