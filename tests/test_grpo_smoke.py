"""Plain TRL GRPOTrainer on the tiny model: proves the harness and catches TRL/transformers breakage early."""

from conftest import digit_count_reward, params_changed, snapshot
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


def test_grpo_two_steps_change_weights(tiny_model_path, cpu_args, toy_dataset):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    before = snapshot(model)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=digit_count_reward,
        args=GRPOConfig(**cpu_args),
        train_dataset=toy_dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert params_changed(before, trainer.model) > 0
    assert any("reward" in log for log in trainer.state.log_history)
