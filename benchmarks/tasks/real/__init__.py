"""The real-model benchmark: SmolLM2-135M-Instruct on generated GSM8K-style word problems.

- `task`: the problems, their reference solutions written the way the model writes, the splits and the
  non-math chat conversations; `themes`: the problems' wording;
- `judge`: the rule judge (an oracle teacher) for MInTRL, a `trl_mintrl.judges.FunctionJudge`;
- `calibration`: MInTRL's two preconditions measured on the model before any method runs;
- `warm_start`: the format warm-up every arm starts from, and the regimes' splits;
- `arms`, `run`, `measures`, `scoring`, `tables`: the comparison's arms, one run of an arm as a harness job, what it
  measures of a policy, and the tables read from its records.

Imports run one way: these modules import `trl_mintrl` and `benchmarks`' library, never the toy task or a study.
"""
