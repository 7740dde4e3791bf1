"""The parts of :mod:`course_utils.capstone.optimize`: ``report`` (the table, plot and guide) and ``techniques`` (the
lessons' techniques wrapped for reuse). Import from :mod:`course_utils.capstone.optimize`."""
