"""Which machine a results row came from: a file-name-safe machine name that tells cloned machines apart.

:func:`machine_id` names the results file and the leaderboard label: host name, GPU (else CPU) model and the
results folder's :func:`install_id`, a random id renewed whenever :func:`machine_fingerprint` (machine-id, host
name, MAC addresses) changes, so attendees on VMs cloned from one image never share a file or a label.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

from course_utils.supply.errors import CourseError
from course_utils.supply.paths import results_dir

INSTALL_ID_FILE = ".install_id"


def machine_fingerprint() -> str:
    """A digest of what tells this machine from a clone of its image: machine-id, host name and MAC addresses.

    A VM cloned from an image keeps the image's files (``results/.install_id`` too) but gets its own
    machine-id (systemd regenerates it), host name or network card; any of them changing gives a new id.
    """
    import hashlib
    import socket

    parts = [socket.gethostname()]
    for f in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            parts.append(Path(f).read_text().strip())
            break
        except OSError:
            continue
    macs = []
    with contextlib.suppress(OSError):
        nics = sorted(Path("/sys/class/net").iterdir())
        physical = [n for n in nics if (n / "device").exists()]  # veth/docker/bridges come and go: not those
        for nic in physical or [n for n in nics if n.name != "lo"]:
            with contextlib.suppress(OSError):
                macs.append((nic / "address").read_text().strip())
    parts += [m for m in macs if m.strip("0:")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def install_id(folder: Path | None = None) -> str:
    """A random 6-hex-digit id of this results folder *on this machine*, kept in ``.install_id``.

    Attendees on identical machine images share host name and CPU; this id keeps their result files and
    leaderboard labels apart. The file holds ``<id> <machine fingerprint>``: a folder copied with a cloned
    VM image (same file, another machine) gets a fresh id on first use, so clones do not share one; a file of
    the older one-field format is renewed once the same way (rows already written keep their file, which
    still loads). A file holding bytes that are not text is renewed too, with a warning naming it; a folder in
    its place raises :class:`CourseError` naming it. Concurrent first calls agree: the id is chosen under a lock.
    """
    folder = folder or results_dir()
    path = folder / INSTALL_ID_FILE
    mine = machine_fingerprint()
    damaged = False

    def current() -> str | None:
        nonlocal damaged
        try:
            fields = path.read_bytes().decode("utf-8").split()
        except OSError:
            return None
        except UnicodeDecodeError:  # a damaged file: renewed below, saying so
            damaged = True
            return None
        if len(fields) == 2 and fields[1] == mine:
            return re.sub(r"[^A-Za-z0-9]", "", fields[0])[:12] or None
        return None

    found = current()
    if found:
        return found
    with open(folder / f"{INSTALL_ID_FILE}.lock", "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        found = current()  # another process may have chosen it while we waited
        if not found:
            found = secrets.token_hex(3)
            tmp = folder / f"{INSTALL_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
            tmp.write_text(f"{found} {mine}\n")
            try:
                os.replace(tmp, path)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise CourseError(
                    f"{path} cannot be replaced ({exc.strerror}; a folder of that name?): it should be a small text "
                    "file holding this results folder's install id. Remove it and run again (a new id is chosen)."
                ) from None
            if damaged:
                warnings.warn(
                    f"{path} held bytes that are not text (a damaged file): wrote a new install id, {found}; rows "
                    "recorded from now on go to a new results file (the older file still loads)",
                    stacklevel=2,
                )
    return found


def machine_id() -> str:
    """A file-name-safe name for this machine: host name, GPU name if present else CPU model, and the
    :func:`install_id` (so identical machine images stay apart)."""
    import socket

    import torch

    from course_utils.measuring.device import cpu_model, has_cuda

    hw = torch.cuda.get_device_name(0) if has_cuda() else cpu_model()
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{socket.gethostname()}_{hw}").strip("-")[:112]
    return f"{name}_{install_id()}"
