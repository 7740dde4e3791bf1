"""Moved to :mod:`course_utils.check.standins.tensorrt` (exercises and the rehearsal use it)."""

from course_utils.check.standins.tensorrt import *  # noqa: F403
from course_utils.check.standins.tensorrt import PLAN_MAGIC, FakeTRT, _readable, fake_from_snapshot  # noqa: F401
