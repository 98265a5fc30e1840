"""An ordinary PyTorch inference script (it does not import dynamo). Run it with the JIT on:

    PYTHONPATH=python_shim .venv/bin/python -m dynamo --report examples/python/score_batches.py

It scores random batches with a small classifier, computes calibration statistics, and prints
a checksum that must be the same with and without the JIT.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, features=256, hidden=512, classes=10):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        h = F.gelu(self.fc1(self.norm(x)))
        return self.fc2(h)


def confidence(logits, temperature):
    p = F.softmax(logits / temperature, dim=-1)
    entropy = -(p * torch.log(p + 1e-9)).sum(-1)
    return p.amax(-1), entropy


def standardize(x):
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)


def log_progress(step, conf):
    if step % 5 == 0:  # printing is a side effect: this function always runs in CPython
        print(f"step {step}: mean confidence {conf.mean():.4f}")


def main(steps):
    torch.manual_seed(0)
    model = Classifier().eval()
    total = torch.zeros(())
    with torch.no_grad():
        for step in range(steps):
            x = standardize(torch.randn(64, 256))
            conf, ent = confidence(model(x), 1.5)
            log_progress(step, conf)
            total += conf.sum() - ent.sum()
    print(f"checksum {total.item():.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
