"""Train the digits CNN and MLP shipped in data/ and record their sha256 in data/SHA256SUMS.

Run: .venv/bin/python -m scripts.train_digits   (about a minute on 2 CPU cores; deterministic seeds)
The lessons never train these at run time: they load the shipped weights (checksum verified).
"""

from __future__ import annotations

import torch
from torch import nn

from course_utils.supply.data import DATA_DIR, load_digits_split
from course_utils.supply.models import DigitsCNN, DigitsMLP, accuracy
from scripts.checksums import write_checksums


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> nn.Module:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * ((len(x) + 63) // 64))
    gen = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 64):
            idx = perm[i : i + 64]
            xb = x[idx]
            # light augmentation: shift by one pixel at random
            shift = int(torch.randint(-1, 2, (1,), generator=gen))
            xb = torch.roll(xb, shifts=shift, dims=3)
            loss = nn.functional.cross_entropy(model(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def main() -> None:
    torch.manual_seed(0)
    d = load_digits_split()
    for name, cls, epochs, lr in [("cnn", DigitsCNN, 30, 3e-3), ("mlp", DigitsMLP, 40, 1e-3)]:
        model = train(cls(), d.x_train, d.y_train, epochs, lr)
        acc = accuracy(model, d.x_test, d.y_test)
        print(f"digits {name}: test accuracy {acc:.2%}")
        if acc < 0.95:
            raise SystemExit(f"{name} reached only {acc:.2%} (< 95%): not saved")
        torch.save(model.state_dict(), DATA_DIR / f"digits_{name}.pt")
    write_checksums(accept_all=True)  # these files were regenerated on purpose


if __name__ == "__main__":
    main()
