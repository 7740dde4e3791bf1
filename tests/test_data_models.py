"""The shipped data and models (course_utils.supply.data and models): the fixed digits split, the shipped models'
accuracy, checksums and weights files.

Shipped-data oddities (issue 24): stray JPEGs, a changed photo, a data file linked to /dev/zero or a FIFO (and the
checksums script on a FIFO), and the torch weights cache (torch.hub's folder, an unreadable TORCH_HOME, an
unreadable weights file)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from course_utils.supply import data, models
from course_utils.supply.errors import (
    BadArgumentError,
    ChecksumError,
    CourseError,
    MissingFileError,
    WeightsFileError,
)


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


@pytest.fixture
def data_copy(tmp_path, monkeypatch) -> Path:
    """A copy of data/images and SHA256SUMS, used by the data module in place of the shipped folder."""
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(data.DATA_DIR / "images", folder / "images")
    shutil.copy(data.DATA_DIR / "SHA256SUMS", folder / "SHA256SUMS")
    monkeypatch.setattr(data, "DATA_DIR", folder)
    return folder


def test_stray_jpegs_are_ignored_with_a_note_naming_them(data_copy):
    shipped = [p.name for p in data.jpeg_paths()]
    (data_copy / "images" / "my_cat.jpg").write_bytes(b"\xff\xd8\xff my own photo")
    (data_copy / "images" / f"._{shipped[0]}").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    with pytest.warns(UserWarning, match=r"ignored 2 file\(s\) .*(\._|my_cat).*SHA256SUMS") as caught:
        again = [p.name for p in data.jpeg_paths()]
    assert again == shipped
    assert "my_cat.jpg" in str(caught[0].message) and f"._{shipped[0]}" in str(caught[0].message)


def test_a_changed_shipped_photo_still_fails_its_checksum(data_copy):
    victim = sorted((data_copy / "images").glob("*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ChecksumError, match=victim.name):
        data.jpeg_paths()


def _finishes(fn, seconds: float = 10.0):
    """Run ``fn`` in a thread; (finished, exception or result)."""
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["value"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), box.get("value")


def _sums(folder: Path, name: str) -> None:
    (folder / "SHA256SUMS").write_text(f"{'0' * 64}  {name}\n")


def test_a_data_file_linked_to_dev_zero_stops_with_a_clear_error(tmp_path):
    _sums(tmp_path, "digits_cnn.pt")
    (tmp_path / "digits_cnn.pt").symlink_to("/dev/zero")
    done, out = _finishes(lambda: data.verified_path("digits_cnn.pt", data_dir=tmp_path))
    assert done, "the checksum read of a link to /dev/zero did not stop"
    assert isinstance(out, ChecksumError) and "a character device" in str(out) and "/dev/zero" in str(out)
    assert "git checkout -- " in str(out)


def test_a_data_file_that_is_a_fifo_stops_with_a_clear_error(tmp_path):
    _sums(tmp_path, "digits_cnn.pt")
    fifo = tmp_path / "digits_cnn.pt"
    os.mkfifo(fifo)
    try:
        done, out = _finishes(lambda: data.verified_path("digits_cnn.pt", data_dir=tmp_path))
    finally:
        try:  # unblock a reader left waiting by a broken implementation
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert done, "the checksum read of a FIFO did not stop"
    assert isinstance(out, ChecksumError) and "a FIFO" in str(out)


def test_the_checksums_script_names_a_fifo_instead_of_dropping_it(tmp_path):
    from scripts import checksums

    _sums(tmp_path, "a.txt")
    (tmp_path / "a.txt").write_text("x")
    os.mkfifo(tmp_path / "b.txt")
    try:
        done, out = _finishes(lambda: checksums.write_checksums(tmp_path))
    finally:
        try:
            os.close(os.open(tmp_path / "b.txt", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert done and isinstance(out, ChecksumError) and "b.txt" in str(out) and "FIFO" in str(out)


def test_torch_cache_follows_torch_hub_get_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.torch_cache_dir() == Path(torch.hub.get_dir()) / "checkpoints"
    assert models.torch_cache_dir() == tmp_path / "xdg" / "torch" / "hub" / "checkpoints"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCH_HOME", "~/th")
    assert models.torch_cache_dir() == tmp_path / "home" / "th" / "hub" / "checkpoints"


def test_unreadable_torch_home_falls_back_to_random_weights_with_a_note(monkeypatch, tmp_path):
    home = tmp_path / "th"
    (home / "hub" / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("TORCH_HOME", str(home))
    if os.geteuid() == 0:  # root reads through permissions: make the cache folder refuse like a locked one
        real = Path.is_file

        def locked(self):
            if str(self).startswith(str(home)):
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(Path, "is_file", locked)
    else:
        home.chmod(0)
    try:
        model, note = models.resnet("resnet18")
    finally:
        home.chmod(0o700)
    assert not model.training
    assert "random weights" in note and "cannot be read" in note and "PermissionError" in note


def test_an_unreadable_weights_file_is_called_unreadable_not_a_pickle(tmp_path):
    unreadable = tmp_path / "resnet18.pth"
    unreadable.mkdir()  # a folder where the file should be: unreadable for root too
    with pytest.raises(WeightsFileError) as info:
        models.load_weights(unreadable, fix="copy a good one there.")
    msg = str(info.value)
    assert "unreadable" in msg and "IsADirectoryError" in msg and "pickle" not in msg and "copy a good one" in msg
    if os.geteuid() != 0:
        locked = tmp_path / "locked.pth"
        torch.save({"w": torch.zeros(1)}, locked)
        locked.chmod(0)
        with pytest.raises(WeightsFileError, match="unreadable .*PermissionError"):
            models.load_weights(locked, fix="x")


def test_a_pickle_is_still_called_unsafe(tmp_path):
    bad = tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(1), "f": print}, bad)
    with pytest.raises(WeightsFileError, match="safe loader refused"):
        models.load_weights(bad, fix="x")


def test_load_weights_refuses_a_dict_mixing_tensors_and_other_values(tmp_path):
    torch.save({"fc.weight": torch.ones(2, 2), "step": 3}, tmp_path / "mixed.pt")
    with pytest.raises(WeightsFileError, match="not a state dict of tensors"):
        models.load_weights(tmp_path / "mixed.pt", fix="x")
    torch.save({"fc.weight": torch.ones(2, 2), "fc.bias": torch.zeros(2)}, tmp_path / "good.pt")
    assert sorted(models.load_weights(tmp_path / "good.pt", fix="x")) == ["fc.bias", "fc.weight"]


def test_accuracy_counts_every_row_including_a_partial_last_batch():
    scores = torch.eye(10)[[3, 1, 4, 1, 5]]  # the "model" returns its input: predictions 3, 1, 4, 1, 5
    labels = torch.tensor([3, 0, 4, 0, 5])  # right on rows 0, 2 and 4 (the last one, alone in its batch of 2)
    assert models.accuracy(torch.nn.Identity(), scores, labels, batch_size=2) == pytest.approx(3 / 5)
    assert models.accuracy(torch.nn.Identity(), scores, labels, batch_size=5) == pytest.approx(3 / 5)
    assert models.accuracy(torch.nn.Identity(), scores[:4], labels[:4], batch_size=3) == pytest.approx(2 / 4)


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_shipped_digits_models_load_in_eval_mode(name):
    """Loaded for inference: no module in training mode, so an image's output does not depend on the batch it
    comes in (BatchNorm with its stored statistics, not the batch's) and running the model changes no buffer."""
    d = data.load_digits_split()
    model = models.load_digits_model(name)
    assert [n for n, m in model.named_modules() if m.training] == []
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    with torch.no_grad():
        whole = model(d.x_test[:64])
        alone = torch.cat([model(d.x_test[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(alone, whole[:4], rtol=1e-4, atol=1e-5)
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())
