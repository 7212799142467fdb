"""vLLM modes (no vLLM needed): TRL's two modes are accepted, anything else is refused before the model loads, and a
synchronized engine (tensor-parallel group, server) keeps every rank in every round and judge call."""

from types import SimpleNamespace

import pytest
from conftest import run_on_two_processes

from trl_mintrl.engines.vllm import check_vllm_mode_supported


@pytest.mark.parametrize(
    "mode,tp",
    [("colocate", 1), ("colocate", 2), ("colocate", 8), ("server", 1), ("server", 4)],
)
def test_both_trl_modes_and_tensor_parallelism_are_accepted(mode, tp):
    check_vllm_mode_supported(SimpleNamespace(use_vllm=True, vllm_mode=mode, vllm_tensor_parallel_size=tp))


def test_unknown_mode_is_refused_only_with_vllm():
    with pytest.raises(ValueError, match=r"vllm_mode must be one of \('colocate', 'server'\), got 'remote'"):
        check_vllm_mode_supported(SimpleNamespace(use_vllm=True, vllm_mode="remote"))
    check_vllm_mode_supported(SimpleNamespace(use_vllm=False, vllm_mode="remote"))


def test_trainers_refuse_an_unknown_mode_before_loading_the_model(cpu_args, toy_dataset):
    from trl_mintrl import MInTRLConfig, MInTRLTrainer, SORTConfig, SORTTrainer

    base = {k: v for k, v in cpu_args.items() if k != "num_generations"}
    for trainer_cls, config in [
        (MInTRLTrainer, MInTRLConfig(**base, num_control_generations=2, num_intervened_generations=2)),
        (SORTTrainer, SORTConfig(**base, num_generations=4)),
    ]:
        config.use_vllm, config.vllm_mode = True, "remote"
        with pytest.raises(ValueError, match="vllm_mode must be one of"):
            trainer_cls(
                "no/such-model",
                reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                args=config,
                train_dataset=toy_dataset,
            )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tp", "server"])
def test_every_rank_joins_every_round_and_judge_call(mode, tiny_model_path, tmp_path):
    """2 processes, MInTRL with a self-judge on our real synchronized engine (its backend call replaced by
    `transformers`). Rank 0 holds the controls, done after one round; rank 1 the intervened rollouts (chunks,
    reviews, corrections). Each engine call checks that both ranks are in the same call, with a 60 s collective
    timeout, so a rank that skipped a round or a judge call fails the run."""
    controls, intervened = run_on_two_processes(
        "vllm_modes_script.py", mode, tiny_model_path, str(tmp_path), out=tmp_path
    )
    assert controls["steps"] == intervened["steps"] == 2
    assert [kind for kind, _ in controls["calls"]] == [kind for kind, _ in intervened["calls"]]
    for idle_rollout, busy_rollout in zip(controls["rollout_calls"], intervened["rollout_calls"], strict=True):
        # round 1: a policy call with prompts on both ranks, then rank 0 joins the rest of rank 1's rollout empty
        assert idle_rollout[0] == ["policy", 2] and busy_rollout[0] == ["policy", 2]
        assert all(n == 0 for _, n in idle_rollout[1:]) and all(n == 2 for _, n in busy_rollout)
        kinds = [kind for kind, _ in busy_rollout]
        assert kinds.count("policy") >= 2 and kinds.count("judge") >= 2  # a review and a correction at least
    assert all(r["judge_rows"] == [False, False] for r in controls["records"])
    assert all(r["judge_rows"] == [True, True] for r in intervened["records"])  # corrections reached training
    if mode == "server":
        # only the main process talks to the server; one request per distinct max_tokens in a call, EOS as stop
        assert intervened["requests"] is None and controls["requests"]
        assert all(stop == [2] for _, _, stop in controls["requests"])
        first = controls["requests"][:2]  # round 1: controls (whole budget 12) and intervened (chunk 4) together
        assert sorted(cap for _, cap, _ in first) == [4, 12]
