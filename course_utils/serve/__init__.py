"""Lesson 13's server process, its request guard and the load generator."""
