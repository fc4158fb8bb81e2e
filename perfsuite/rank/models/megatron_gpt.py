"""A Megatron-style GPT built only from nn.Linear, nn.Embedding and nn.LayerNorm.

Why not transformers' GPT-2: its projections are ``Conv1D`` modules, which
DTensor tensor parallelism (``parallelize_module``) refuses. This model has the
same shape as GPT-2 / Megatron GPT (learned position embeddings, pre-LN blocks,
GELU MLP, final LayerNorm) with plain ``nn.Linear`` projections, so the
Megatron split applies directly: q/k/v and fc1 column-parallel, the attention
output projection and fc2 row-parallel, the token embedding and LM head
vocab-parallel.

The LM head is its own ``nn.Linear(hidden, vocab, bias=False)`` (untied from
the token embedding), so the first and last pipeline stages need no
embedding-gradient all-reduce. That adds ``vocab x hidden`` parameters over a
tied GPT: GPT-1.3B (24 x 2048, vocab 50304) has 1,416,744,960 parameters here
against 1,313,722,368 tied.

Three parts make it splittable into pipeline stages: ``embed`` (token ids ->
hidden states), ``blocks`` (an ``nn.ModuleList``; hidden states in and out)
and ``head`` (final LayerNorm + LM head: hidden states -> logits).
:class:`GPTStage` chains any of them; the full model is the single stage that
owns all three. ``forward(input_ids, labels=None)`` returns an object with
``.loss`` (next-token cross entropy, labels shifted inside) and ``.logits``,
like a transformers causal-LM model.

Attention takes its local head count from the q projection's output width
(``q.shape[-1] // head_dim``), so it runs unchanged when tensor parallelism
shards the heads across ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from perfsuite.core.models import ModelSpec

INIT_STD = 0.02  # GPT-2 / Megatron initialisation


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy: position t predicts label t + 1
    (labels equal to -100 are ignored)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, vocab).float(),
        labels[:, 1:].reshape(-1),
    )


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, hidden: int, max_positions: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.tokens(input_ids) + self.positions(positions)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[0], x.shape[1]
        q, k, v = self.q(x), self.k(x), self.v(x)
        local_heads = q.shape[-1] // self.head_dim  # heads / tp under tensor parallelism

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, local_heads, self.head_dim).transpose(1, 2)

        context = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        return self.out(context.transpose(1, 2).reshape(batch, seq, local_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the LM head (hidden states -> logits)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln(x))


class GPTStage(nn.Module):
    """A contiguous slice of the model: optional ``embed``, some ``blocks``,
    optional ``head``. Input: token ids if it owns ``embed``, else hidden
    states; output: logits if it owns ``head``, else hidden states."""

    def __init__(
        self, embed: Embedding | None, blocks: Sequence[Block], head: Head | None, layers_total: int | None = None
    ) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head
        self.layers_total = layers_total if layers_total is not None else len(blocks)
        """Blocks of the whole model: the residual projections' init depends on it."""

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 / Megatron init of this slice: N(0, 0.02), zero biases, unit LayerNorms, and
        N(0, 0.02 / sqrt(2 * layers)) for the projections that feed the residual. Other modules
        (a tensor-parallel embedding) run their ``reset_parameters``."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif module is not self and not isinstance(module, GPTStage):
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()
        # modules(), not self.blocks: a block may sit inside a checkpoint or compile wrapper by now.
        for block in (m for m in self.modules() if isinstance(m, Block)):
            for proj in (block.attn.out, block.mlp.fc2):
                nn.init.normal_(proj.weight, std=INIT_STD / math.sqrt(2 * self.layers_total))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


class MegatronGPT(GPTStage):
    """The whole model: the one stage that owns embeddings, all blocks and the head."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, max_positions: int) -> None:
        if hidden % heads:
            raise ValueError(f"heads={heads} must divide hidden={hidden}")
        super().__init__(
            Embedding(vocab, hidden, max_positions),
            [Block(hidden, heads, ffn) for _ in range(layers)],
            Head(hidden, vocab),
        )
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> CausalLMOutput:  # type: ignore[override]
        logits = super().forward(input_ids)
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutput(loss=loss, logits=logits)

    def stage(self, index: int, count: int) -> GPTStage:
        """Stage ``index`` of ``count`` equal slices of the blocks; stage 0 owns
        the embeddings, the last stage the final LayerNorm and LM head. The
        stage shares its modules (and parameters) with this model."""
        layers = len(self.blocks)
        if not 0 <= index < count or layers % count:
            raise ValueError(f"cannot take stage {index} of {count} from {layers} blocks")
        per = layers // count
        return GPTStage(
            self.embed if index == 0 else None,
            [b for b in self.blocks[index * per : (index + 1) * per] if isinstance(b, Block)],
            self.head if index == count - 1 else None,
            layers_total=layers,
        )


def build(m: ModelSpec) -> nn.Module:
    """The model for a ModelSpec of family ``megatron_gpt``."""
    return MegatronGPT(
        vocab=m.vocab, hidden=m.hidden, layers=m.layers, heads=m.heads, ffn=m.ffn_size, max_positions=m.max_positions
    )
