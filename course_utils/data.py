"""Offline data: scikit-learn's bundled digits, the shipped JPEG photos, and sha256 checks of shipped files.

Nothing here downloads. Every file shipped in ``data/`` is listed in ``data/SHA256SUMS``; :func:`verified_path`
checks a file against it before it is used, so a corrupted or edited file fails with a clear
:class:`ChecksumError` naming the file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import ChecksumError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHECKSUMS = DATA_DIR / "SHA256SUMS"
SEED = 0


def sha256(path: str | Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def recorded_checksums(checksums: Path = CHECKSUMS) -> dict[str, str]:
    """The ``SHA256SUMS`` file as {relative path: hex digest}."""
    out = {}
    if checksums.exists():
        for line in checksums.read_text().splitlines():
            if line.strip():
                digest, name = line.split(maxsplit=1)
                out[name.lstrip("*").strip()] = digest
    return out


def verified_path(name: str, *, data_dir: Path = DATA_DIR) -> Path:
    """Path of shipped file ``name`` (relative to ``data/``) after checking its sha256; raise if it differs."""
    path = data_dir / name
    if not path.exists():
        raise FileNotFoundError(f"shipped file {path} is missing: restore it with `git checkout -- data/{name}`")
    expected = recorded_checksums(data_dir / "SHA256SUMS").get(name)
    if expected is None:
        raise ChecksumError(f"{path} has no entry in {data_dir / 'SHA256SUMS'}: add one with `make checksums`")
    actual = sha256(path)
    if actual != expected:
        raise ChecksumError(
            f"checksum mismatch for {path}: sha256 {actual[:16]}... but SHA256SUMS records {expected[:16]}... "
            f"The file is corrupted or was changed: restore it with `git checkout -- data/{name}` "
            "(or retrain with `python -m scripts.train_digits` and `make checksums`)."
        )
    return path


@dataclass
class Digits:
    """The digits split used by every lesson: images scaled to [0, 1], shape (N, 1, 8, 8), int64 labels."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @staticmethod
    def flat(x: torch.Tensor) -> torch.Tensor:
        """Images as flat 64-vectors, the MLP's input."""
        return x.reshape(x.shape[0], -1)


def load_digits_split(test_fraction: float = 0.25) -> Digits:
    """scikit-learn's bundled 1797 8x8 digits, split with a fixed seed (same split in every lesson)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, random_state=SEED, stratify=y)
    return Digits(*(torch.from_numpy(a) for a in (xtr, ytr, xte, yte)))


def jpeg_paths() -> list[Path]:
    """The real JPEG photos shipped in ``data/images`` (checksums verified), sorted by name."""
    paths = sorted((DATA_DIR / "images").glob("*.jpg"))
    if not paths:
        raise FileNotFoundError(f"no JPEGs in {DATA_DIR / 'images'}: restore them with `git checkout -- data/images`")
    return [verified_path(f"images/{p.name}") for p in paths]
