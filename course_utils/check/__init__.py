"""What checks a result: output comparison with per-precision tolerances, the exercises and their checkers."""
