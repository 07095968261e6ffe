"""joblease benchmarks: ``python -m bench`` (see docs/benchmarks.md)."""
