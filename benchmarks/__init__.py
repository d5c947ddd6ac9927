"""Benchmarks: pytest-benchmark micro-benchmarks and the side-by-side comparison (the compare package)."""
