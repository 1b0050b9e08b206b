"""Real checkpoints for demos, tests and benchmarks: a small GPT-style LM trained with AdamW on CPU."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any


def train_tiny_gpt(
    save_at: Iterable[int], *, width: int = 64, layers: int = 2, vocab: int = 96, seq: int = 16,
    batch: int = 32, lr: float = 3e-3, seed: int = 0,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (step, state) at each step in `save_at`: model + AdamW state_dicts and a few scalars.

    Each state is a deep copy (training goes on after it is yielded), as a trainer would save it.
    """
    import torch

    wanted = sorted(set(save_at))
    torch.manual_seed(seed)
    block = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
    model = torch.nn.ModuleDict(
        {"emb": torch.nn.Embedding(vocab, width), "body": torch.nn.TransformerEncoder(block, layers),
         "head": torch.nn.Linear(width, vocab)}
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.randint(0, vocab, (batch * 4, seq + 1))
    for step in range(wanted[-1] + 1 if wanted else 0):
        rows = data[(step % 4) * batch : (step % 4 + 1) * batch]
        logits = model["head"](model["body"](model["emb"](rows[:, :-1])))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), rows[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in wanted:
            yield step, copy.deepcopy(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                 "loss": float(loss.detach()), "note": "tiny-gpt"}
            )
