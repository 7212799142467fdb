"""The real-model benchmark (issue 45): SmolLM2-135M-Instruct on generated GSM8K-style word problems.

- `task`: the problems, their reference solutions written the way the model writes, the splits and the
  non-math chat conversations;
- `judge`: the rule judge (an oracle teacher) for MInTRL, a `trl_mintrl.judges.FunctionJudge`;
- `calibration`: MInTRL's two preconditions measured on the model before any method runs.

Imports run one way: these modules import `trl_mintrl` and `benchmarks`' library (provenance), never the toy task or
a study script.
"""
