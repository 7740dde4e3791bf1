"""Record data/SHA256SUMS for the shipped files in data/ (weights, images, sentences; not reference results).

New files are added. A file whose digest differs from the recorded one is NOT re-recorded unless named with
``--accept NAME`` (or ``--accept-all``): a changed shipped file is usually damage, and regenerating the sums
would approve it. With SHA256SUMS missing the script stops and says to restore it from git, unless
``--from-scratch`` is given.

    python -m scripts.checksums                      # add new files, refuse changed ones
    python -m scripts.checksums --accept digits_cnn.pt   # after retraining with scripts.train_digits
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_utils.supply.data import CHECKSUMS, DATA_DIR, recorded_checksums, sha256
from course_utils.supply.errors import ChecksumError, CourseError, MissingFileError

SHIPPED_SUFFIXES = {".pt", ".jpg", ".txt", ".json", ".csv"}


def shipped_files(data_dir: Path = DATA_DIR) -> list[Path]:
    """Every file under ``data_dir`` that SHA256SUMS covers. Anything with a shipped suffix that is not a folder is
    listed, FIFOs and links to devices included: :func:`sha256` then stops on it with a clear error instead of
    leaving it out of the sums (or reading forever). macOS ``._*`` files are not shipped files."""
    return sorted(
        p for p in data_dir.rglob("*")
        if not p.is_dir() and p.suffix in SHIPPED_SUFFIXES and p.name != "SHA256SUMS" and "reference" not in p.parts
        and not p.name.startswith("._")
    )  # fmt: skip


def write_checksums(
    data_dir: Path = DATA_DIR, *, accept: set[str] = frozenset(), accept_all: bool = False, from_scratch: bool = False
) -> None:
    """Write ``data_dir/SHA256SUMS``: new files added, changed ones only when accepted.

    Nothing is written when SHA256SUMS is missing without ``from_scratch`` (:class:`MissingFileError`) or when
    a recorded file changed and was not accepted (:class:`ChecksumError`); each message names the fix.
    """
    sums = data_dir / "SHA256SUMS"
    if not sums.exists() and not from_scratch:
        raise MissingFileError(
            f"{sums} is missing: restore it with `git checkout -- data/SHA256SUMS`. Regenerating it would approve "
            "whatever is on disk; pass --from-scratch only for a new data folder."
        )
    old = recorded_checksums(sums) if sums.exists() else {}
    lines, refused = [], []
    for p in shipped_files(data_dir):
        name = p.relative_to(data_dir).as_posix()
        digest = sha256(p)
        if name in old and old[name] != digest and not (accept_all or name in accept):
            refused.append(name)
            digest = old[name]
        lines.append(f"{digest}  {name}\n")
    if refused:
        raise ChecksumError(
            f"{sums} not written: these files differ from their recorded sha256: {', '.join(refused)}. If they are "
            "damaged, restore them with `git checkout -- data/<name>`; if you changed them on purpose (e.g. "
            "retrained), re-record each with `python -m scripts.checksums --accept NAME`."
        )
    sums.write_text("".join(lines))
    print(f"wrote {sums} ({len(lines)} files)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--accept", action="append", default=[], metavar="NAME", help="re-record this changed file")
    ap.add_argument("--accept-all", action="store_true", help="re-record every changed file")
    ap.add_argument("--from-scratch", action="store_true", help="create SHA256SUMS when there is none")
    args = ap.parse_args(argv)
    try:
        write_checksums(CHECKSUMS.parent, accept=set(args.accept), accept_all=args.accept_all,
                        from_scratch=args.from_scratch)  # fmt: skip
    except CourseError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
