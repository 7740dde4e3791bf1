"""Course exceptions that render as one clear line in Jupyter.

IPython calls ``_render_traceback_`` on an exception when it exists, so a learner sees
``DeviceUnavailableError: ...`` and the fix, not a wall of frames from library internals.
Outside Jupyter they behave like ordinary exceptions.
"""

from __future__ import annotations


class CourseError(Exception):
    """Base class: an error whose message already names the fix."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class DeviceUnavailableError(CourseError, RuntimeError):
    """A device (CUDA, MPS) was asked for but this machine does not have it."""


class GPURequiredError(CourseError, RuntimeError):
    """Strict GPU mode is on and a GPU-only section could not run."""


class ChecksumError(CourseError, ValueError):
    """A shipped file does not match its recorded sha256 (corrupted or edited)."""


class ToleranceError(CourseError, AssertionError):
    """An optimized variant's outputs differ from the baseline by more than the stated tolerance."""


class MissingBackendError(CourseError, ImportError):
    """An optional backend (TensorRT, ONNX Runtime, ...) is not installed."""


class SettingError(CourseError, ValueError):
    """An environment variable of the course (COURSE_SMOKE, COURSE_RESULTS_DIR, ...) holds an unusable value."""


class WeightsFileError(CourseError, ValueError):
    """A weights file cannot be loaded safely: it is not a plain tensor checkpoint, or it is damaged."""


class BadArgumentError(CourseError, ValueError):
    """An argument cannot be used (an unknown model name, an empty table): the message names what works."""


class MissingFileError(CourseError, FileNotFoundError):
    """A file the course ships (weights, photos, checksums) is not on disk: the message says how to restore it."""
