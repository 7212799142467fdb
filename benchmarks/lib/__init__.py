"""The benchmarks' shared library: jobs and runs, seeds, records, provenance, statistics, plots, report and README blocks."""
