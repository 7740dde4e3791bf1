"""Code a later lesson reuses after its own lesson wrote it out (the lesson is the code: read it there first)."""
