import shutil

import pytest
import torch

from course_utils import data, models
from course_utils.errors import ChecksumError


def test_digits_split_is_fixed_and_shaped():
    d = data.load_digits_split()
    assert d.x_train.shape[1:] == (1, 8, 8) and d.x_test.shape[0] == 450
    assert float(d.x_train.max()) <= 1.0 and d.y_test.dtype == torch.int64
    assert data.Digits.flat(d.x_test).shape == (450, 64)
    assert torch.equal(d.y_test, data.load_digits_split().y_test)


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_shipped_digits_models_reach_95_percent(name):
    d = data.load_digits_split()
    model = models.load_digits_model(name)
    acc = models.accuracy(model, d.x_test, d.y_test)
    assert acc >= 0.95, f"{name} accuracy {acc:.2%}"


def test_unknown_model_name():
    with pytest.raises(ValueError, match="cnn"):
        models.load_digits_model("vit")


def test_corrupted_weights_fail_with_checksum_error_naming_the_file(tmp_path):
    shutil.copy(data.CHECKSUMS, tmp_path / "SHA256SUMS")
    bad = tmp_path / "digits_cnn.pt"
    raw = bytearray((data.DATA_DIR / "digits_cnn.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="digits_cnn.pt"):
        data.verified_path("digits_cnn.pt", data_dir=tmp_path)


def test_missing_and_unlisted_files(tmp_path):
    (tmp_path / "SHA256SUMS").write_text("")
    with pytest.raises(FileNotFoundError, match="git checkout"):
        data.verified_path("nothing.pt", data_dir=tmp_path)
    (tmp_path / "x.pt").write_bytes(b"1")
    with pytest.raises(ChecksumError, match="no entry"):
        data.verified_path("x.pt", data_dir=tmp_path)


def test_every_shipped_file_matches_its_checksum():
    recorded = data.recorded_checksums()
    assert "digits_cnn.pt" in recorded and any(k.startswith("images/") for k in recorded)
    for name, digest in recorded.items():
        assert data.sha256(data.DATA_DIR / name) == digest, name


def test_jpegs_are_real_photos():
    from PIL import Image

    paths = data.jpeg_paths()
    assert len(paths) >= 5
    with Image.open(paths[0]) as im:
        assert im.format == "JPEG" and min(im.size) >= 256


def test_resnet_without_cache_uses_random_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    model, note = models.resnet("resnet18")
    assert "random weights" in note and not model.training
    assert models.torch_cache_dir() == tmp_path / "hub" / "checkpoints"
    with pytest.raises(ValueError):
        models.resnet("vgg")


def test_minilm_loads_offline():
    model = models.minilm()
    emb = model.encode(["a sentence", "another one"], convert_to_tensor=True)
    assert emb.shape == (2, 384)
