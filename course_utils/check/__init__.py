"""What checks a result: output comparison with per-precision tolerances, the exercises and their checkers,
the recording stream checker and the CPU stand-ins that rehearse GPU code."""
