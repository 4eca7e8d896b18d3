"""The demo's model: a small tied-embedding language model and one AdamW step (imported when the demo runs)."""
from __future__ import annotations

import torch


class _Block(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(h)
        self.up = torch.nn.Linear(h, 4 * h)
        self.down = torch.nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + down(gelu(up(norm(x))))``: a pre-norm residual MLP block, same shape out as in."""
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class DemoLM(torch.nn.Module):
    """Tied embedding, ``layers`` MLP blocks, a final norm."""

    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.Sequential(*[_Block(hidden) for _ in range(layers)])
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.emb.weight
        torch.nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)`` of token ids ``x`` of shape ``(batch, seq)``."""
        return self.head(self.norm(self.blocks(self.emb(x))))


def step(model: DemoLM, opt: torch.optim.Optimizer, vocab: int, device: torch.device, seed: int) -> float:
    """One AdamW step on random tokens; returns the loss."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(0, vocab, (4, 65), device=device, generator=g)
    loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    opt.step()
    return float(loss.detach())


__all__ = ["DemoLM", "step"]
