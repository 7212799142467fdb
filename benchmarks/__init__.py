"""Benchmarks and the toy task they run on (not part of the installed package)."""
