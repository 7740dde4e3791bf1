"""The exercise checks of the GPU inference course: the checker machinery (``exercises``: time limits, verdicts, the
registry) and each lesson's checkers with their reference solutions (``lesson_exercises/lNN.py``).

A package learners have no reason to open: a lesson reaches it as ``cu.exercises`` (``cu.exercises.check``,
``cu.exercises.show_solution``), and checking one exercise loads that lesson's checkers only. It stands above
``course_utils`` (the bench its checkers use) and ``fakegpu`` (the stand-ins that rehearse GPU answers)."""
