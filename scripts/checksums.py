"""Write data/SHA256SUMS for every shipped file in data/ (weights, images, sentences, reference results)."""

from __future__ import annotations

from course_utils.data import CHECKSUMS, DATA_DIR, sha256

SHIPPED_SUFFIXES = {".pt", ".jpg", ".txt", ".json", ".csv"}


def write_checksums() -> None:
    files = sorted(
        p for p in DATA_DIR.rglob("*")
        if p.is_file() and p.suffix in SHIPPED_SUFFIXES and p.name != "SHA256SUMS" and "reference" not in p.parts
    )  # fmt: skip
    CHECKSUMS.write_text("".join(f"{sha256(p)}  {p.relative_to(DATA_DIR).as_posix()}\n" for p in files))
    print(f"wrote {CHECKSUMS} ({len(files)} files)")


if __name__ == "__main__":
    write_checksums()
