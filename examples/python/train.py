"""An ordinary PyTorch training script (it does not import dynamo). Run it with the JIT on:

    PYTHONPATH=python_shim .venv/bin/python -m dynamo --report examples/python/train.py

It trains a small transformer classifier on random token sequences for 20 steps with AdamW and
prints the loss of each step; the losses must be the same with and without the JIT (within
float rounding). The report lists the model's forward and backward graphs and the AdamW step's
compiled update, with their native runs.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyClassifier(nn.Module):
    def __init__(self, vocab=100, dim=64, heads=4, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.block(self.embed(tokens))
        return self.head(self.norm(h).mean(1))


def batches(steps, batch=16, length=24, vocab=100, classes=5):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, length), generator=g)
        yield tokens, tokens[:, 0] % classes  # a learnable rule: the class of the first token


def main(steps=20):
    torch.manual_seed(0)
    model = TinyClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step, (tokens, labels) in enumerate(batches(steps)):
        loss = F.cross_entropy(model(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:2d}  loss {loss.item():.5f}")
    return losses


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
