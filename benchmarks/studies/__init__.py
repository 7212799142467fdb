"""The studies: one module each, holding its arms, its hypotheses and its report; each runs as
`python -m benchmarks.studies.<name>` from the repository root. Importing any of them first sets the benchmarks'
environment (one thread, offline, quiet TRL), before torch is imported."""

from benchmarks.lib.harness import quiet_environment

quiet_environment()
