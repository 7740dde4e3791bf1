"""Write the JPEG photos shipped in data/images from scikit-image's bundled sample data (offline).

Run once by the course authors (scikit-image is not a course dependency); the JPEGs are committed.
Licences: see data/images/LICENSE.md.
"""

from __future__ import annotations

from PIL import Image
from skimage import data

from course_utils.supply.data import DATA_DIR
from scripts.checksums import write_checksums

NAMES = ["astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field"]


def main() -> None:
    out = DATA_DIR / "images"
    out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        img = getattr(data, name)()
        Image.fromarray(img).convert("RGB").save(out / f"{name}.jpg", quality=90)
        print(name, img.shape)
    write_checksums(accept_all=True)  # these files were regenerated on purpose


if __name__ == "__main__":
    main()
