"""A MInTRL and a SORT training step's phases, each run once through the trainers' own code (nothing re-implemented)
on a randomly initialised Qwen3 built offline: the model, the rows, the two trainers on one copy of the weights, a
prepared long micro-batch, and `measure_phases`, which runs generation, both losses, the optimizer step and SORT's
repair update inside a `PhaseMeter`'s phases. The memory study runs it on the CPU, scripts/gpu_check.py on a GPU."""

from __future__ import annotations

from benchmarks.lib.phase_meter import PhaseMeter


def build_tokenizer(max_length: int):
    from trl_mintrl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(vocab_size=1024)
    tokenizer.model_max_length = max_length
    return tokenizer


def build_model(tokenizer, shape: dict, *, max_positions: int, device="cpu", dtype=None, seed: int = 0):
    """A randomly initialised Qwen3 causal LM of `shape` (hidden, layers, intermediate, heads, kv_heads, head_dim;
    optional vocab, larger than the tokenizer's to give the embedding a real size: ids the tokenizer does not know
    decode to nothing), built on `device` in `dtype` without downloading anything."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=max(shape.get("vocab", 0), len(tokenizer)),
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=max_positions,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    dtype = dtype or torch.float32
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def prompts_and_references(n: int, reference_tokens: int, tokenizer, offset: int = 0) -> list[dict]:
    """`n` dataset rows: a conversational prompt and a reference solution of at least `reference_tokens` tokens (the
    repair cuts it to exactly that many with `max_reference_tokens`)."""
    import random

    words = "so we get step first then compute check add subtract multiply total value therefore".split()
    rows = []
    for i in range(offset, offset + n):
        rng = random.Random(i)
        parts, length = [], 0
        while length < reference_tokens:
            chunk = " ".join(rng.choice(words) + f" {rng.randrange(1000)}" for _ in range(64)) + "\n\n"
            parts.append(chunk)
            length += len(tokenizer(chunk, add_special_tokens=False)["input_ids"])
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Problem {i}: compute {i % 97} + {i % 89} step by step."}],
                "solution": "".join(parts),
            }
        )
    return rows


def constant_reward(completions, **kwargs):
    """Every rollout correct: no prompt is deferred by the generation phase, the buffer holds what we put in."""
    return [1.0] * len(completions)


def _keep_judge():
    from trl_mintrl.judges import FunctionJudge

    return FunctionJudge(lambda question, prefix, steps, reference: None, lambda question, prefix, reference: "")


def trainer_args(settings: dict, config: dict, output_dir: str, device: str) -> dict:
    """The `GRPOConfig` fields shared by both trainers."""
    on_gpu = device == "cuda"
    return dict(
        output_dir=output_dir,
        use_cpu=not on_gpu,
        bf16=on_gpu,
        gradient_checkpointing=settings["gradient_checkpointing"],
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        max_steps=10,
        per_device_train_batch_size=config["micro_batch"],
        generation_batch_size=settings["generation_batch"],
        max_completion_length=settings["generation_tokens"],
        temperature=1.0,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        remove_unused_columns=False,
    )


def _supported(config_class, overrides: dict) -> dict:
    """The overrides that `config_class` has fields for (fields added by later versions of the repair)."""
    from dataclasses import fields

    names = {f.name for f in fields(config_class)}
    return {k: v for k, v in overrides.items() if k in names}


def build_trainers(model, tokenizer, settings: dict, config: dict, output_dir: str, device: str, with_mintrl=True):
    """A `SORTTrainer` and a `MInTRLTrainer` on the same model object (one copy of the weights)."""
    from datasets import Dataset

    from trl_mintrl import MInTRLConfig, MInTRLTrainer, SORTConfig, SORTTrainer

    common = trainer_args(settings, config, output_dir, device)
    data = Dataset.from_list(prompts_and_references(8, 16, tokenizer, offset=10_000))
    sort_overrides = {
        "num_generations": settings["num_generations"],
        "repair_batch_size": config["repair_batch_size"],
        "max_reference_tokens": settings["reference_tokens"],
        "max_plan_tokens": settings["plan_tokens"],
        # fields of the micro-batched repair, set where this version has them: one repair per step, a
        # buffer large enough for the configuration's items
        **_supported(
            SORTConfig,
            {"max_repairs_per_step": 1, **dict.fromkeys(BUFFER_CAPACITY_FIELDS, max(64, config["buffer_items"]))},
        ),
    }
    sort = SORTTrainer(
        model,
        reward_funcs=constant_reward,
        args=SORTConfig(**common, **sort_overrides),
        train_dataset=data,
        processing_class=tokenizer,
    )
    mintrl = None
    if with_mintrl:
        half = settings["num_generations"] // 2
        mintrl = MInTRLTrainer(
            model,
            reward_funcs=constant_reward,
            args=MInTRLConfig(
                **{**common, "output_dir": output_dir + "/mintrl"},
                num_control_generations=half,
                num_intervened_generations=settings["num_generations"] - half,
                chunk_size=max(settings["generation_tokens"] // 2, 1),
                max_reviews=1,
                max_correction_tokens=8,
                intervention_steps=100,
            ),
            train_dataset=data,
            processing_class=tokenizer,
            judge=_keep_judge(),
        )
    return sort, mintrl


# the buffer's capacity field of the micro-batched repair, where this version has it
BUFFER_CAPACITY_FIELDS = ("repair_buffer_size",)


def prepared_micro_batch(output: dict, rows: int, completion_tokens: int, vocab: int, seed: int = 0) -> dict:
    """TRL's generation output cut to a micro-batch of `rows` rows, with completions of `completion_tokens` random
    token ids (none of them EOS or padding), as `_prepare_inputs` hands `compute_loss` one micro-batch. A judge
    token mask (`tool_mask`, 0 on 3% of the tokens) is added for MInTRL's loss."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    device = output["prompt_ids"].device
    total = output["prompt_ids"].shape[0]
    batch = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == total:
            if value.dim() == 1:
                batch[key] = value[:rows]  # per-row values: advantages and the like
            elif key.startswith("prompt"):
                batch[key] = value[:rows]
            # per-token tensors of the short generated completions are replaced below or dropped
        elif key not in ("completion_ids", "completion_mask"):
            batch[key] = value
    batch["completion_ids"] = torch.randint(4, vocab, (rows, completion_tokens), generator=generator).to(device)
    batch["completion_mask"] = torch.ones(rows, completion_tokens, dtype=torch.long, device=device)
    batch["advantages"] = torch.randn(rows, generator=generator).to(device)
    if "num_items_in_batch" in output:  # tokens of the whole generation batch (DAPO's normaliser)
        batch["num_items_in_batch"] = torch.tensor(total * completion_tokens, device=device)
    judge = torch.rand(rows, completion_tokens, generator=generator) < 0.03
    batch["tool_mask"] = (~judge).long().to(device)
    return batch


def warm_optimizer(trainer) -> bool:
    """Create the trainer's optimizer and its state (AdamW's moments) with a zero-gradient step, as the first training
    step would, so that no measured phase allocates optimizer state; the same for the repair's own optimizer state
    (`repair_optimizer="own"`), stepped as the separate repair steps step it (`repair.optimizer.stepping()`).
    Returns whether a repair state of its own was warmed (False with `repair_optimizer="shared"`)."""
    import torch

    def zero_step():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        trainer.optimizer.step()
        trainer.model.zero_grad(set_to_none=True)

    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    zero_step()
    if trainer.repair.optimizer.own_state is None:
        return False
    with trainer.repair.optimizer.stepping():
        zero_step()
    return True


def enable_checkpointing(model, args) -> bool:
    """Turn activation checkpointing on as `Trainer.train` does when `args.gradient_checkpointing` is set (the phases
    run the trainers' code without `train()`, which is where transformers turns it on); returns whether it is on.
    transformers 5.18+ names it `activation_checkpointing_enable`, earlier versions `gradient_checkpointing_enable`."""
    if not args.gradient_checkpointing:
        return False
    kwargs = args.gradient_checkpointing_kwargs or None
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        return model.is_activation_checkpointing
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model.is_gradient_checkpointing


def measure_phases(sort, mintrl, model, tokenizer, settings: dict, config: dict, meter: PhaseMeter) -> dict:
    """Run every phase once through the trainers' code, inside `meter`'s phases. Returns facts about the run."""
    import torch

    facts = {}
    model.train()
    facts["activation_checkpointing"] = enable_checkpointing(model, sort.args)
    for trainer in (sort, mintrl):
        if trainer is not None and not getattr(trainer, "current_gradient_accumulation_steps", None):
            trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    gen_rows = settings["generation_batch"]
    group = settings["num_generations"]
    rows = [r for r in prompts_and_references(gen_rows // group, 16, tokenizer, offset=20_000) for _ in range(group)]

    with meter.phase("generation (GRPO)"):
        output = sort._generate_and_score_completions(rows)
    facts["generated_tokens_grpo"] = int(output["completion_mask"].sum())
    if mintrl is not None:
        with meter.phase("generation (MInTRL)"):
            mintrl_output = mintrl._generate_and_score_completions(rows)
        facts["generated_tokens_mintrl"] = int(mintrl_output["completion_mask"].sum())
        del mintrl_output

    batch = prepared_micro_batch(output, config["micro_batch"], settings["completion_tokens"], model.vocab_size)
    facts["loss_batch"] = list(batch["completion_ids"].shape)
    del output
    facts["repair_optimizer_warmed"] = warm_optimizer(sort)  # optimizer states exist before the steps, as in training
    for name, trainer in (("GRPO loss", sort), ("MInTRL loss", mintrl)):
        if trainer is None:
            continue
        inputs = batch if name == "MInTRL loss" else {k: v for k, v in batch.items() if k != "tool_mask"}
        with meter.phase(name):
            loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)
        facts[f"{name} value"] = float(loss.detach())
        del loss
        with meter.phase("optimizer step"):  # the step that follows either loss: clipping and AdamW
            sort.accelerator.clip_grad_norm_(model.parameters(), sort.args.max_grad_norm)
            sort.optimizer.step()
        model.zero_grad(set_to_none=True)
    del batch

    repair = sort.repair
    for row in prompts_and_references(config["buffer_items"], settings["reference_tokens"], tokenizer):
        repair.buffer.add(row["prompt"], row["solution"])
    facts["buffer_before_repair"] = len(repair.buffer)
    facts["wrapped"] = {
        "_write_plans": meter.wrap(repair, "_write_plans", "repair: plan"),
        "_reference_logps": meter.wrap(
            repair,
            "_reference_logps",
            lambda: "repair: base pass" if torch.is_grad_enabled() else "repair: teacher pass",
        ),
    }
    with meter.phase("repair update"):
        repair.separate_repair_step()
    facts["buffer_after_repair"] = len(repair.buffer)
    facts["repairs"] = repair.buffer.counters.get("repairs")
    return facts


def checkpointing_state(asked: bool, runs: list[dict]) -> str:
    """Whether the runs measured with activation checkpointing, as their facts record it: runs before that fact was
    recorded asked for it but never turned it on (`Trainer.train` does, and the phases run without it)."""
    if not asked:
        return "off"
    if runs and all(r["facts"].get("activation_checkpointing") for r in runs):
        return "on"
    return (
        "asked for but NOT on in these runs (they predate `enable_checkpointing`: `Trainer.train` turns it on and the "
        "phases run without `train()`, so every layer's activations were kept; rerun the script for checkpointed "
        "numbers)"
    )
