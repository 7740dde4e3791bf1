"""Lesson 14's ``optimize()``: every technique of the course tried on any model (``optimize``), with its report and
the techniques it wraps (``optimizing``)."""
