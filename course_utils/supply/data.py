"""Offline data: scikit-learn's bundled digits, the shipped JPEG photos, and sha256 checks of shipped files.

Nothing here downloads. Every file shipped in ``data/`` is listed in ``data/SHA256SUMS``; :func:`verified_path`
checks a file against it before it is used, so a corrupted or edited file fails with a clear
:class:`ChecksumError` naming the file. Every hint says to restore from git; none says to regenerate the sums,
which would approve whatever is on disk (a missing SHA256SUMS is :class:`MissingFileError`, a bad line names
its line).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from course_utils.supply.errors import ChecksumError, MissingFileError
from course_utils.supply.paths import DATA_DIR, REPO_ROOT

CHECKSUMS = DATA_DIR / "SHA256SUMS"
SEED = 0


MAX_SHIPPED_BYTES = 1 << 30  # the largest shipped file is a few MB; nothing the course ships is over 1 GB


def sha256(path: str | Path) -> str:
    """Hex sha256 of a regular file (read up to its size, at most :data:`MAX_SHIPPED_BYTES`).

    A FIFO, a device (a link to ``/dev/zero``), a folder or an oversized file raises :class:`ChecksumError`
    naming it, instead of reading forever.
    """
    path = Path(path)
    try:
        st = os.stat(path)  # follows links: a link to /dev/zero is a character device here
    except FileNotFoundError:
        raise MissingFileError(f"{path} is missing: restore it with `git checkout -- {_in_repo(path)}`") from None
    kind = "" if stat.S_ISREG(st.st_mode) else _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
    if kind or st.st_size > MAX_SHIPPED_BYTES:
        what = kind or f"{st.st_size} bytes, over the {MAX_SHIPPED_BYTES >> 20} MB a shipped file can have"
        link = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise ChecksumError(
            f"{path}{link} is not a shipped file ({what}), so its checksum cannot be read. Remove it and "
            f"restore the real file with `git checkout -- {_in_repo(path)}`."
        )
    h, left = hashlib.sha256(), st.st_size
    with open(path, "rb") as fh:
        while left > 0:
            chunk = fh.read(min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}  # fmt: skip


def recorded_checksums(checksums: Path = CHECKSUMS) -> dict[str, str]:
    """The ``SHA256SUMS`` file as {relative path: hex digest}.

    Raises :class:`ChecksumError` naming the file when it is missing (restore it from git: regenerating it
    would approve whatever is on disk) or naming the file and line when a line is not ``<sha256>  <path>``.
    """
    if not checksums.exists():
        raise MissingFileError(
            f"{checksums} is missing, so no shipped file can be checked. Restore it from git: "
            f"`git checkout -- {_in_repo(checksums)}` (do not regenerate it: that would approve whatever is on disk)."
        )
    out = {}
    for number, line in enumerate(checksums.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not re.fullmatch(r"[0-9a-fA-F]{64}", parts[0]):
            raise ChecksumError(
                f"{checksums}, line {number}: {line[:80]!r} is not '<64 hex digits>  <path>'. The file was edited "
                f"or damaged: restore it with `git checkout -- {_in_repo(checksums)}`."
            )
        out[parts[1].lstrip("*").strip()] = parts[0].lower()
    return out


def _in_repo(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (for `git checkout -- ...` hints)."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def verified_path(name: str, *, data_dir: Path = DATA_DIR) -> Path:
    """Path of shipped file ``name`` (relative to ``data/``) after checking its sha256; raise if it differs."""
    path = data_dir / name
    if not path.exists():
        raise MissingFileError(f"shipped file {path} is missing: restore it with `git checkout -- {_in_repo(path)}`")
    sums = data_dir / "SHA256SUMS"
    expected = recorded_checksums(sums).get(name)
    if expected is None:
        raise ChecksumError(
            f"{path} has no entry in {sums}. If SHA256SUMS was edited, restore it with "
            f"`git checkout -- {_in_repo(sums)}`; a course developer adding a new shipped file records it with "
            "`make checksums`."
        )
    actual = sha256(path)
    if actual != expected:
        raise ChecksumError(
            f"checksum mismatch for {path}: sha256 {actual[:16]}... but SHA256SUMS records {expected[:16]}... "
            f"The file is corrupted or was changed: restore it with `git checkout -- {_in_repo(path)}`."
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
    """The real JPEG photos shipped in ``data/images`` (checksums verified), sorted by name.

    Only the photos listed in ``SHA256SUMS`` are used: any other ``.jpg`` there (a learner's own photo, the
    ``._name.jpg`` files macOS leaves on shared drives) is ignored with a warning naming it.
    """
    folder = DATA_DIR / "images"
    sums = recorded_checksums(DATA_DIR / "SHA256SUMS")
    listed = {n.split("/", 1)[1] for n in sums if n.startswith("images/") and n.endswith(".jpg")}
    on_disk = sorted(p.name for p in folder.glob("*.jpg"))
    extra = [n for n in on_disk if n not in listed]
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        warnings.warn(
            f"ignored {len(extra)} file(s) in {folder} that the course does not ship ({shown}): only the photos "
            "listed in data/SHA256SUMS are used. Move your own photos elsewhere to silence this note.",
            stacklevel=2,
        )
    names = sorted(listed)
    if not names or not (set(names) & set(on_disk)):
        raise MissingFileError(f"no shipped JPEGs in {folder}: restore them with `git checkout -- data/images`")
    return [verified_path(f"images/{n}", data_dir=DATA_DIR) for n in names]
