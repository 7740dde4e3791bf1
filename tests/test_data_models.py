import shutil

import pytest
import torch

from course_utils.supply import data, models
from course_utils.supply.errors import BadArgumentError, ChecksumError, CourseError, MissingFileError, WeightsFileError


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
    with pytest.raises(BadArgumentError, match="cnn"):
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


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # would create the marker file if unpickled unsafely


def _bad_weight_files(folder):
    import pickle

    marker = folder / "code-ran"
    files = {
        "pickle": pickle.dumps(_Evil(marker)),
        "torch-saved pickle": None,
        "junk": b"\x00junk" * 20,
        "empty": b"",
        "truncated": (data.DATA_DIR / "digits_mlp.pt").read_bytes()[:5000],
    }
    return marker, files


def _assert_names_fix_without_unsafe_hint(exc, path):
    import traceback

    text = "".join(traceback.format_exception(exc))
    assert str(path) in str(exc)
    assert "weights_only=False" not in text and "trusted source" not in text, text
    assert isinstance(exc, CourseError)


def test_torch_cache_file_replaced_by_pickle_or_junk_gives_course_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cache = models.torch_cache_dir()
    cache.mkdir(parents=True)
    import torchvision.models as tvm

    target = cache / tvm.ResNet18_Weights.DEFAULT.url.rsplit("/", 1)[1]
    marker, files = _bad_weight_files(tmp_path)
    for kind, raw in files.items():
        if raw is None:
            torch.save(_Evil(marker), target)
        else:
            target.write_bytes(raw)
        with pytest.raises(WeightsFileError, match="rm ") as info:
            models.resnet("resnet18")
        _assert_names_fix_without_unsafe_hint(info.value, target)
        assert not marker.exists(), f"{kind}: the pickle ran code"
    torch.save({"fc.weight": torch.zeros(3, 3)}, target)  # tensors, but not resnet18's
    with pytest.raises(WeightsFileError, match="does not hold resnet18's weights"):
        models.resnet("resnet18")


def test_load_weights_names_the_fix(tmp_path):
    marker, files = _bad_weight_files(tmp_path)
    for kind, raw in files.items():
        f = tmp_path / f"{kind}.pt"
        torch.save(_Evil(marker), f) if raw is None else f.write_bytes(raw)
        with pytest.raises(WeightsFileError, match="restore it with git") as info:
            models.load_weights(f, fix="restore it with git.")
        _assert_names_fix_without_unsafe_hint(info.value, f)
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    with pytest.raises(WeightsFileError, match="not a state dict"):
        models.load_weights(tmp_path / "list.pt", fix="x")
    assert not marker.exists()


def test_bad_checksums_line_names_file_and_line(tmp_path):
    good = (data.CHECKSUMS.read_text().splitlines())[0]
    (tmp_path / "SHA256SUMS").write_text(f"{good}\nnot-a-digest digits_cnn.pt\n")
    shutil.copy(data.DATA_DIR / "digits_cnn.pt", tmp_path)
    with pytest.raises(ChecksumError, match=r"SHA256SUMS, line 2: 'not-a-digest digits_cnn.pt'.*git checkout"):
        data.verified_path("digits_cnn.pt", data_dir=tmp_path)
    (tmp_path / "SHA256SUMS").write_text(f"{good}\n{'a' * 64}\n")  # digest without a name
    with pytest.raises(ChecksumError, match="line 2"):
        data.recorded_checksums(tmp_path / "SHA256SUMS")


def test_checksums_in_upper_case_or_binary_mode_are_read(tmp_path):
    digest, name = data.CHECKSUMS.read_text().splitlines()[0].split(maxsplit=1)
    (tmp_path / "SHA256SUMS").write_text(f"{digest.upper()} *{name}\n")  # what `sha256sum -b` may write
    assert data.recorded_checksums(tmp_path / "SHA256SUMS") == {name: digest.lower()}
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(data.DATA_DIR / name, tmp_path / name)
    assert data.verified_path(name, data_dir=tmp_path) == tmp_path / name


def test_missing_checksums_file_says_restore_from_git_not_regenerate(tmp_path):
    shutil.copy(data.DATA_DIR / "digits_cnn.pt", tmp_path)
    with pytest.raises(MissingFileError, match="git checkout") as info:
        data.verified_path("digits_cnn.pt", data_dir=tmp_path)
    assert "make checksums" not in str(info.value) and "SHA256SUMS is missing" in str(info.value)


def test_checksums_script_refuses_to_approve_changed_or_unchecked_files(tmp_path):
    from scripts import checksums

    with pytest.raises(MissingFileError, match="missing"):
        checksums.write_checksums(tmp_path)
    (tmp_path / "a.txt").write_text("one")
    checksums.write_checksums(tmp_path, from_scratch=True)
    recorded = data.recorded_checksums(tmp_path / "SHA256SUMS")
    (tmp_path / "a.txt").write_text("changed")
    (tmp_path / "b.txt").write_text("new")
    with pytest.raises(ChecksumError, match="a.txt"):
        checksums.write_checksums(tmp_path)
    assert data.recorded_checksums(tmp_path / "SHA256SUMS") == recorded  # nothing written
    checksums.write_checksums(tmp_path, accept={"a.txt"})
    assert set(data.recorded_checksums(tmp_path / "SHA256SUMS")) == {"a.txt", "b.txt"}
    assert data.verified_path("a.txt", data_dir=tmp_path)


def test_checksums_command_exits_1_naming_the_fix(tmp_path, monkeypatch, capsys):
    from scripts import checksums

    (tmp_path / "a.txt").write_text("one")
    monkeypatch.setattr(checksums, "CHECKSUMS", tmp_path / "SHA256SUMS")
    assert checksums.main([]) == 1 and "git checkout -- data/SHA256SUMS" in capsys.readouterr().err
    assert checksums.main(["--from-scratch"]) == 0
    (tmp_path / "a.txt").write_text("two")
    assert checksums.main([]) == 1 and "--accept NAME" in capsys.readouterr().err
    assert checksums.main(["--accept", "a.txt"]) == 0
    assert data.recorded_checksums(tmp_path / "SHA256SUMS")["a.txt"] == data.sha256(tmp_path / "a.txt")
