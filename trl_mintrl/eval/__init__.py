"""pass@k evaluation as a library: the estimator and summaries (`passk`), sampling and scoring a model on
benchmarks with resume (`runner`), and the sweep over a training run's checkpoints (`checkpoints`).
The command line (`trl-mintrl eval`) lives in `trl_mintrl.cli.eval`."""

from .passk import format_table, pass_at_k, summarize
from .runner import SamplingSettings, Scorer, build_engine, evaluate, evaluate_benchmark, load_samples

__all__ = [
    "SamplingSettings",
    "Scorer",
    "build_engine",
    "evaluate",
    "evaluate_benchmark",
    "format_table",
    "load_samples",
    "pass_at_k",
    "summarize",
]
