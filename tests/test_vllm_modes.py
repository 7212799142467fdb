"""vLLM modes our multi-round rollouts cannot run correctly are refused at construction (no vLLM needed)."""

from types import SimpleNamespace

import pytest

from trl_mintrl.engines.vllm import check_vllm_mode_supported


@pytest.mark.parametrize(
    "args,message",
    [
        (SimpleNamespace(use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=1), "vllm_mode='server'"),
        (SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2), "tensor_parallel_size=2"),
    ],
)
def test_unsupported_modes_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        check_vllm_mode_supported(args)


def test_supported_modes_pass():
    check_vllm_mode_supported(SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=1))
    check_vllm_mode_supported(SimpleNamespace(use_vllm=False, vllm_mode="server", vllm_tensor_parallel_size=8))


def test_trainers_refuse_server_mode_before_loading_the_model(cpu_args, toy_dataset):
    from trl_mintrl import MInTRLConfig, MInTRLTrainer, SORTConfig, SORTTrainer

    base = {k: v for k, v in cpu_args.items() if k != "num_generations"}
    for trainer_cls, config in [
        (MInTRLTrainer, MInTRLConfig(**base, num_control_generations=2, num_intervened_generations=2)),
        (SORTTrainer, SORTConfig(**base, num_generations=4)),
    ]:
        config.use_vllm, config.vllm_mode = True, "server"
        with pytest.raises(ValueError, match="vllm_mode='server'"):
            trainer_cls("no/such-model", reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                        args=config, train_dataset=toy_dataset)
