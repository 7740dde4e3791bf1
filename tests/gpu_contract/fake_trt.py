"""Moved to :mod:`course_utils.standins.tensorrt` (exercises and the rehearsal use it); re-exported until removed."""

from course_utils.standins.tensorrt import *  # noqa: F403
from course_utils.standins.tensorrt import PLAN_MAGIC, FakeTRT, _readable, fake_from_snapshot  # noqa: F401
