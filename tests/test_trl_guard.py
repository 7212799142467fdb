"""Fail loudly when a TRL private method or attribute that trl-mintrl relies on changes.

TRL's GRPOTrainer is subclassed by wrapping its private seams. They change between minor versions, which is why
pyproject pins `trl>=1.16,<1.17`. If this test fails after an upgrade, read the new signature, adapt the wrapper
that uses it (named in each entry), then update the expectation here.
"""

import inspect
import re
from pathlib import Path

import pytest
import trl
from accelerate import Accelerator
from transformers import Trainer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

import trl_mintrl

# method -> (parameter names after self, where trl-mintrl uses it)
EXPECTED_SIGNATURES = {
    "_generate_and_score_completions": (["inputs"], "MInTRL/SORT: stash the batch rows, rewrite advantages"),
    "_calculate_rewards": (["inputs", "prompts", "completions", "completion_ids_list"], "MInTRL/SORT: capture rewards"),
    "_compute_loss": (["model", "inputs"], "MInTRL: regression loss; SORT: add the repair loss"),
    "_get_per_token_logps_and_entropies": (
        ["model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
         "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
         "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"],
        "MInTRL loss and SORT scoring passes",
    ),
    "_generate": (["prompts"], "rollout_func seam (env_mask -> tool_mask)"),
    "_tokenize_prompts": (["prompts"], "MInTRL rollout: prompt ids exactly as TRL templates them"),
    "_get_output_dir": (["trial"], "checkpoint folder for extra state"),
    "_save_checkpoint": (["model", "trial"], "SORT buffer / MInTRL schedule state"),
    "_load_optimizer_and_scheduler": (["checkpoint"], "restore extra state on resume"),
    "__init__": (
        ["model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class",
         "reward_processing_classes", "callbacks", "optimizers"],
        "MInTRLTrainer/SORTTrainer.__init__ (SORT passes model, reward_funcs, args, train_dataset by position)",
    ),
    "train": (["resume_from_checkpoint"], "GRPOTrainerBase.train: resume_from_checkpoint=True -> last complete one"),
    "training_step": (["model", "inputs", "num_items_in_batch"], "SORT joint repair: first micro-batch via _step"),
    "compute_loss_context_manager": ([], "SORT's separate repair step (autocast around the repair forward)"),
    "create_model_card": (["model_name", "dataset_name", "tags"], "trainer_base.TrainerExtras.create_model_card"),
    "_tool_call_loop": (
        ["prompts", "prompt_ids", "completion_ids", "completions", "logprobs", "images", "multimodal_fields"],
        "MInTRLTrainer._tool_call_loop: hands back what the intervention rollout's tools did",
    ),
    "_get_tool_suffix_ids": (["tool_messages"], "mintrl/tools.py TRLToolEnvironment.result_ids"),
}  # fmt: skip


def test_trl_minor_version_is_the_pinned_one():
    assert trl.__version__.startswith("1.16."), f"trl-mintrl is written against TRL 1.16, found {trl.__version__}"


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_private_signature_unchanged(name):
    expected, used_by = EXPECTED_SIGNATURES[name]
    method = getattr(GRPOTrainer, name, None)
    assert method is not None, f"GRPOTrainer.{name} is gone in TRL {trl.__version__}; it is used by {used_by}"
    params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    names = [p.name for p in params]
    # new parameters may follow ours, but only with defaults: our calls do not pass them
    required = [p.name for p in params[len(expected) :] if p.default is p.empty and p.kind <= p.KEYWORD_ONLY]
    assert names[: len(expected)] == expected and not required, (
        f"GRPOTrainer.{name} changed signature in TRL {trl.__version__}: expected {expected}, got {names}. "
        f"Adapt {used_by}."
    )


def test_optimizer_step_callback_runs_between_the_step_and_the_schedule():
    """SORT's separate repair step runs in `on_optimizer_step`: after `optimizer.step()` (the main update is done),
    before the scheduler step and `global_step += 1` (same learning rate, not a step of the schedule)."""
    expected = ["args", "state", "control", "kwargs"]
    assert list(inspect.signature(TrainerCallback.on_optimizer_step).parameters)[1:] == expected
    source = inspect.getsource(Trainer._run_epoch)
    order = [
        "self.current_gradient_accumulation_steps = ",
        "self.optimizer.step()",
        "self.callback_handler.on_optimizer_step(",
        "self.lr_scheduler.step()",
        "self.state.global_step += 1",
    ]
    positions = [source.find(line) for line in order]
    assert -1 not in positions and positions == sorted(positions), (
        f"Trainer._run_epoch no longer runs {order} in this order ({positions}): adapt "
        "sort/repair.py's separate_repair_step (and MInTRL's GA scaling)."
    )


def test_micro_batch_counter_and_loss_scaling_we_rely_on():
    """SORT's joint repair adds its loss on the first micro-batch of an optimizer step: `_step % GA == 0` inside the
    loss, so GRPOTrainer must count `_step` after `Trainer.training_step`. MInTRL divides its loss by the GA steps
    itself, as GRPOTrainer does (`loss_is_scaled_for_ga = True` makes the Trainer skip it). Under DeepSpeed the
    Trainer backwards with `scale_wrt_gas=False`, which SORT's separate repair step mirrors."""
    grpo_step = inspect.getsource(GRPOTrainer.training_step)
    assert 0 <= grpo_step.find("super().training_step(") < grpo_step.find("self._step += 1"), (
        "GRPOTrainer.training_step no longer counts `_step` after the micro-batch: adapt SORT's with_joint_repair"
    )
    assert "self._step = 0" in inspect.getsource(GRPOTrainer.__init__), "GRPOTrainer no longer sets self._step"
    assert GRPOTrainer.loss_is_scaled_for_ga is True, "GRPOTrainer's loss GA scaling changed: adapt MInTRL's loss"
    trainer_step = inspect.getsource(Trainer.training_step)
    assert "if self.loss_is_scaled_for_ga is not None:" in trainer_step
    assert 'kwargs["scale_wrt_gas"] = False' in trainer_step
    backward = inspect.getsource(Accelerator.backward)
    assert "self.deepspeed_engine_wrapped.backward(loss, sync_gradients=self.sync_gradients, **kwargs)" in backward


def test_accelerate_deepspeed_backward_we_call():
    """SORT's separate repair step calls accelerate's DeepSpeed wrapper as `Accelerator.backward` does, with its own
    accumulation boundary (`ReferenceRepair._backward`): the wrapper must take `sync_gradients`, set the engine's
    boundary from it, pass the other keywords (`scale_wrt_gas`) to the engine's backward and step only there."""
    from accelerate.utils.deepspeed import DeepSpeedEngineWrapper

    params = inspect.signature(DeepSpeedEngineWrapper.backward).parameters
    assert list(params)[:3] == ["self", "loss", "sync_gradients"] and "kwargs" in params
    source = inspect.getsource(DeepSpeedEngineWrapper.backward)
    assert "self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)" in source
    assert "self.engine.backward(loss, **kwargs)" in source
    assert source.find("if sync_gradients:") < source.find("self.engine.step()")


def test_every_config_field_we_read_exists():
    """Every `self.args.<name>`, `trainer.args.<name>` and `training_args.<name>` the package reads is a field (or
    property) of GRPOConfig or of one of our configs."""
    configs = [getattr(trl_mintrl, name) for name in trl_mintrl.__all__ if name.endswith("Config")]
    known = set(GRPOConfig.__dataclass_fields__) | {f for config in configs for f in config.__dataclass_fields__}
    root = Path(trl_mintrl.__file__).parent
    read = {}
    for path in root.rglob("*.py"):
        for match in re.finditer(r"\b(?:self\.args|trainer\.args|training_args)\.([a-z_]\w*)", path.read_text()):
            read.setdefault(match.group(1), path.relative_to(root.parent))
    assert len(read) > 20  # the pattern still finds what the trainers read
    missing = {name: str(path) for name, path in read.items() if name not in known and not hasattr(GRPOConfig, name)}
    assert not missing, f"config fields read but gone in TRL {trl.__version__}: {missing}"


def test_rollout_func_contract_in_source():
    """`_generate` must still call `rollout_func(prompts, self)` and turn `env_mask` into the tool mask."""
    source = inspect.getsource(GRPOTrainer._generate)
    assert "self.rollout_func(prompts, self)" in source
    assert 'extra_fields.pop("env_mask", None)' in source
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters


def test_tool_loop_seams_in_source():
    """MInTRL runs the tools inside its rollout (mintrl/tools.py) and answers TRL's `_tool_call_loop` with what they
    did: `_generate` must still call it after the rollout_func when tools are set, take env_mask only without tools,
    and unpack its 7 results in this order; `run_tool_calls` copies its rules for calls and failures; the per-row
    tool dicts and environments are built before `_generate`."""
    generate = _code(GRPOTrainer._generate)
    assert (
        "if self.tools: ( tool_mask, completions, completion_ids, logprobs, tool_call_count, tool_failure_count, "
        "tool_images, ) = self._tool_call_loop( prompts, prompt_ids, completion_ids, completions, logprobs, images, "
        "multimodal_fields )" in generate
    )
    assert generate.index("self._tool_call_loop(") < generate.index('tool_mask = extra_fields.pop("env_mask", None)')
    loop = _code(GRPOTrainer._tool_call_loop)
    for statement in [
        "sync_tool_dict = self._sync_tool_dicts[idx_with_tool]",
        "async_tool_dict = self._async_tool_dicts[idx_with_tool]",
        'if tool_call["type"] == "function":',
        'tool_call_results.append((name, sync_tool_dict[name](**function["arguments"])))',
        'raise ValueError(f"Tool {name} not found.")',
        'result = {"error": str(e)}',
        'tool_call_results.append((name, {"error": f"Unsupported tool call type: {tool_call[\'type\']}"}))',
        "asyncio.run_coroutine_threadsafe( _run_async_tools(async_coros), self.async_loop ).result()",
        "content = result if isinstance(result, list) else str(result)",
        'tool_message = {"role": "tool", "name": name, "content": content}',
        "suffix_ids = self._get_tool_suffix_ids(tool_messages)",
        "len(pct) - len(prompt_ids[i]) > self.max_completion_length or len(pct) >= max_model_len",
        "max_model_len = config.max_position_embeddings",
        "while idxs_with_tool and iteration_num < self.max_tool_calling_iterations:",
        "parse_response( self._tokenizer, ids, prefix=prompt_completion_tool_ids[idx], tools=per_prompt_tools[idx] )",
        "return tool_mask, completions, completion_ids, logprobs, tool_call_count, tool_failure_count, tool_images",
    ]:
        assert statement in loop, f"GRPOTrainer._tool_call_loop changed: {statement!r} is gone"
    score = _code(GRPOTrainer._generate_and_score_completions)
    for statement in [
        "self._batch_environments = [",
        "self._sync_tool_dicts = []",
        "observation = environment.reset(**reset_kwargs)",
    ]:
        assert score.index(statement) < score.index("= self._generate(prompts)"), statement
    assert "per_prompt_tools = [self._env_tools[self._batch_environments[i]] for i in idxs_with_tool]" in loop
    assert list(inspect.signature(trl.chat_template_utils.parse_response).parameters) == [
        "tokenizer", "ids", "prefix", "tools"
    ]  # fmt: skip
    init = _code(GRPOTrainer.__init__)
    for attr in ["self.tools = tools", "self.environment_factories = {None: environment_factory}",
                 "self._env_tools[name] = tools + methods", "self.async_loop_thread, self.async_loop,"]:  # fmt: skip
        assert attr in init, f"GRPOTrainer no longer sets {attr}"


def test_sort_repair_renders_with_trls_templating_on_a_stand_in():
    """SORT's repair renders buffered prompts and reference conversations with TRL's own `_tokenize_prompts` and
    `_get_tool_suffix_ids`, called on a stand-in holding the trainer's templating and the row's tools
    (`trl_mintrl.chat_templating.TrlTemplating`): every attribute they read must be on it, but for the
    per-environment branch, which the stand-in skips (`environment_factories=None`); and TRL must still merge an
    environment's first observation into the prompts before `_generate`, whose prompts the repair records."""
    from types import SimpleNamespace

    from trl_mintrl.chat_templating import TrlTemplating

    stand_in = TrlTemplating(None, None, None, {})._trainer_view([])
    assert isinstance(stand_in, SimpleNamespace)
    offered = set(vars(stand_in))
    branch_only = {"_batch_environments", "_env_tools"}  # read under `if self.environment_factories is not None`
    for method in (GRPOTrainer._tokenize_prompts, GRPOTrainer._get_tool_suffix_ids):
        read = set(re.findall(r"self\.(\w+)", inspect.getsource(method)))
        assert read - branch_only <= offered, f"GRPOTrainer.{method.__name__} now reads {read - branch_only - offered}"
    assert "if self.environment_factories is not None:" in _code(GRPOTrainer._tokenize_prompts)
    score = _code(GRPOTrainer._generate_and_score_completions)
    assert score.index("observation = environment.reset(**reset_kwargs)") < score.index("= self._generate(prompts)")
    init = _code(GRPOTrainer.__init__)
    assert "self._multi_environment = isinstance(environment_factory, dict)" in init


def test_attributes_and_config_fields_we_read():
    fields = GRPOConfig.__dataclass_fields__
    for field in [
        "num_generations",
        "max_completion_length",
        "temperature",
        "epsilon",
        "epsilon_high",
        "beta",
        "mask_truncated_completions",
        "steps_per_generation",
        "use_vllm",
        "vllm_mode",
        "vllm_enable_sleep_mode",
        "ds3_gather_for_generation",
    ]:
        assert field in fields, f"GRPOConfig.{field} is gone"
    for attr in ["_name", "_paper", "_tag_names", "loss_is_scaled_for_ga"]:
        assert hasattr(GRPOTrainer, attr), f"GRPOTrainer.{attr} is gone"
    init_source = inspect.getsource(GRPOTrainer.__init__)
    for attr in [
        "self.generation_config",
        "self.generation_kwargs",
        "self._dist",
        "self.eos_token_ids",
        "self.reward_weights",
        "self._metrics",
        "self.rollout_func",
        "self._tokenizer",
        "self.num_generations",
        "self.num_generations_eval",
        "self.reward_func_names",
        "self._is_vlm",
    ]:
        assert attr in init_source, f"GRPOTrainer no longer sets {attr}"


# ----- trl.experimental.async_grpo, under AsyncMInTRLTrainer (trl_mintrl/mintrl/async_/) -----


def _code(function) -> str:
    """A function's source with whitespace collapsed, so that pinned statements survive reformatting."""
    return " ".join(inspect.getsource(function).split())


# Statements of `AsyncGRPOTrainer.compute_loss` that `AsyncMInTRLTrainer.compute_loss` copies: the unpacking of a packed
# row, the forward, and the per-step accounting. Each must still be in both.
ASYNC_COPIED_LOSS_STATEMENTS = [
    'mask_bool = inputs["attention_mask"].bool()',
    'selected = inputs["token_index"] >= 0',
    'input_ids = inputs["input_ids"][mask_bool].unsqueeze(0)',
    'position_ids = inputs["position_ids"][mask_bool].unsqueeze(0)',
    'shift_labels = inputs["shift_labels"][mask_bool].unsqueeze(0)',
    'token_index = inputs["token_index"][selected]',
    'old_log_probs = inputs["old_log_probs"][selected]',
    'advantages = inputs["advantages"][selected]',
    'segment_id = inputs["segment_id"][selected]',
    'key: inputs[key][inputs[key] >= 0] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")',
    'tree_kwargs["tree_max_seqlen_q"], tree_kwargs["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()',
    "input_ids=input_ids, position_ids=position_ids, shift_labels=shift_labels, fused_lm_head=True,",
    "log_probs = outputs.log_probs.flatten()[token_index]",
    "entropy = outputs.entropy.flatten()[token_index]",
    "self._last_forward_time_s = time.time() - forward_start",
    'n_forward_tokens = float(inputs["global_n_forward_tokens"][0])',
    'mean_seq_len = float(inputs["mean_seq_len"][0])',
    "self._step_forward_tokens += n_forward_tokens",
    "self._step_seq_len_weighted += mean_seq_len * n_forward_tokens",
    "self._step_samples += n_forward_tokens / mean_seq_len",
    "self._step_forward_s += self._last_forward_time_s",
]


def test_async_loss_copies_trls_unpacking_forward_and_accounting():
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from trl_mintrl.mintrl.async_ import AsyncMInTRLTrainer

    params = list(inspect.signature(AsyncGRPOTrainer.compute_loss).parameters)
    assert params == ["self", "model", "inputs", "return_outputs", "num_items_in_batch"]
    trl_loss, ours = _code(AsyncGRPOTrainer.compute_loss), _code(AsyncMInTRLTrainer.compute_loss)
    for statement in ASYNC_COPIED_LOSS_STATEMENTS:
        assert statement in trl_loss, f"AsyncGRPOTrainer.compute_loss changed: {statement!r}; update our copy"
        assert statement in ours, f"AsyncMInTRLTrainer.compute_loss no longer has {statement!r}"
    # the rest of TRL's accounting, which our copy writes without its local `global_n_tokens`
    assert 'global_n_tokens = inputs["global_n_tokens"][0]' in trl_loss
    assert "self._step_trained_tokens += float(global_n_tokens)" in trl_loss
    # our regression divides by the micro-batches of a step itself, as TRL's loss does
    assert AsyncGRPOTrainer.loss_is_scaled_for_ga is True
    assert "loss = loss / self.current_gradient_accumulation_steps" in trl_loss
    # no MoE auxiliary loss with router_aux_loss_coef=0.0 (AsyncMInTRLConfig's default; other values refused)
    init = _code(AsyncGRPOTrainer.__init__)
    assert (
        'self.aux_loss_enabled = hasattr(text_config, "output_router_logits") and self.router_aux_loss_coef != 0.0'
        in init
    )


def test_async_constructor_seams():
    """`AsyncMInTRLTrainer.__init__` builds the worker before TRL's constructor (which reads its queue once),
    mirrors TRL's tokenizer and end-of-completion setup for it, patches the peak-FLOPs lookup around it, and
    re-registers the tree attention after it."""
    from trl.experimental.async_grpo import async_grpo_trainer
    from trl.trainer import utils

    params = list(inspect.signature(async_grpo_trainer.AsyncGRPOTrainer.__init__).parameters)
    assert params[:3] == ["self", "model", "reward_funcs"]
    for name in ("args", "train_dataset", "processing_class", "callbacks", "optimizers", "peft_config",
                 "rollout_worker", "weight_transfer"):  # fmt: skip
        assert name in params, f"AsyncGRPOTrainer.__init__ lost {name}"
    init = _code(async_grpo_trainer.AsyncGRPOTrainer.__init__)
    for statement in [
        "register_tree_attention()",
        "self._peak_flops_per_device = get_peak_flops_per_device(self.accelerator, dtype)",
        "self.rollout_queue = self.rollout_worker.rollout_buffer",
        "processing_class.pad_token = processing_class.eos_token",
        "eos_token_ids = model.generation_config.eos_token_id",
        "eos_token_ids = [processing_class.eos_token_id, *eos_token_ids]",
        "self._trained_groups: set[int] = set()",
        "self._groups_before_resume = 0",
        "self.model_version = 0",
    ]:
        assert statement in init, f"AsyncGRPOTrainer.__init__ no longer has {statement!r}"
    assert init.index("register_tree_attention()") < init.index("self._peak_flops_per_device")
    assert async_grpo_trainer.get_peak_flops_per_device is utils.get_peak_flops_per_device
    assert list(inspect.signature(utils.get_peak_flops_per_device).parameters) == ["accelerator", "dtype"]


def test_async_protocols_and_rollout_path():
    """The protocols our worker and transfers implement, the sample fields our collator reads through TRL's dataset,
    and the dataloader whose collator we swap by its module-global name."""
    from dataclasses import fields

    from trl.experimental.async_grpo import async_grpo_trainer as agt
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    protocol_members = {name for name in vars(agt.RolloutWorkerProtocol) if not name.startswith("_")}
    assert protocol_members == {"start", "stop", "update_model_version", "check_health"}
    assert set(agt.RolloutWorkerProtocol.__annotations__) == {"rollout_buffer", "metrics_queue"}
    transfer_members = {name for name in vars(agt.WeightTransferProtocol) if not name.startswith("_")}
    assert transfer_members == {"init_weight_transfer", "pause", "send_weights", "resume", "destroy"}
    assert [f.name for f in fields(RolloutSample)] == [
        "prompt", "completion", "input_ids", "completion_mask", "old_log_probs", "advantage", "model_version",
        "group_id", "metrics", "enqueued_at",
    ]  # fmt: skip
    dataset = _code(agt.RolloutQueueDataset.__iter__)
    assert "if staleness > self.max_staleness:" in dataset
    assert '"metrics": sample.metrics,' in dataset  # the SampleMetrics object, with the judge mask, by reference
    dataloader = _code(agt.AsyncGRPOTrainer.get_train_dataloader)
    assert "collate_fn=DataCollatorForRollout(" in dataloader
    assert "if self.args.token_budget > 0:" in dataloader and "dataset = FixedCountBatcher(" in dataloader
    assert [f.name for f in fields(agt.DataCollatorForRollout)] == [
        "pad_token_id", "num_processes", "return_tensors", "groups_trained", "metrics", "token_budget",
    ]  # fmt: skip
    assert "packed = [row.pack() for row in rows]" in _code(agt.DataCollatorForRollout.torch_call)


def test_async_training_loop_order():
    """The worker's state is loaded before it starts (transformers loads the optimizer, and our extra state, before
    `on_train_begin`, where TRL syncs the weights and then starts the worker); TRL stops it and the transfer when
    training ends; TRL's own resume state is for its own worker only (else both would write and read one)."""
    from trl.experimental.async_grpo import async_grpo_trainer as agt

    begin = _code(agt._TrainBeginCallback.on_train_begin)
    order = ["weight_transfer.init_weight_transfer()", "self._trainer._sync_weight()", "rollout_worker.start()"]
    positions = [begin.find(statement) for statement in order]
    assert -1 not in positions and positions == sorted(positions), positions
    loop = _code(Trainer._inner_training_loop)
    assert 0 <= loop.find("self._prepare_for_training(") < loop.find("self.callback_handler.on_train_begin(")
    assert "self._load_optimizer_and_scheduler(resume_from_checkpoint)" in _code(Trainer._prepare_for_training)
    inner = _code(agt.AsyncGRPOTrainer._inner_training_loop)
    assert "finally: if self.accelerator.is_main_process: if self.rollout_worker: self.rollout_worker.stop()" in inner
    assert "self.weight_transfer.destroy()" in inner
    assert "isinstance(self.rollout_worker, AsyncRolloutWorker)" in inner
    assert "isinstance(self.rollout_worker, AsyncRolloutWorker)" in _code(agt.AsyncGRPOTrainer._save_checkpoint)
    sync = _code(agt.AsyncGRPOTrainer._sync_weight_merged)
    assert 0 <= sync.find("self.model_version += 1") < sync.find("self.rollout_worker.update_model_version(")
    assert "self.rollout_worker.metrics_queue.get_nowait()" in _code(agt.AsyncGRPOTrainer.log)


def test_async_dataloader_fetches_a_micro_batch_ahead():
    """Why `AsyncMInTRLConfig` refuses `max_staleness=0`: TRL forces `dispatch_batches=True`, and accelerate's
    dispatcher fetches the next micro-batch before it yields the current one, so the rollouts of the next optimizer
    step must exist before this step updates the weights."""
    from accelerate.data_loader import DataLoaderDispatcher
    from trl.experimental.async_grpo import AsyncGRPOConfig

    assert 'self.accelerator_config["dispatch_batches"] = True' in _code(AsyncGRPOConfig.__post_init__)
    dispatcher = _code(DataLoaderDispatcher.__iter__)
    loop = dispatcher.index("while not stop_iteration:")
    fetch_next = dispatcher.find("next_batch, next_batch_info = self._fetch_batches(main_iterator)", loop)
    assert 0 <= loop < fetch_next < dispatcher.find("yield batch", loop)


def test_async_worker_tool_seams():
    """`AsyncMInTRLTrainer`'s rollout worker builds TRL's tools and environments itself (`mintrl/async_/tools.py`
    `WorkerTools`), mirroring `GRPOTrainer`'s set-up and per-batch code, and refuses what `AsyncGRPOTrainer` refuses
    with its messages; TRL's trainer hands `tools` / `environment_factory` to its own worker only."""
    from trl import chat_template_utils
    from trl.experimental.async_grpo import AsyncGRPOTrainer
    from trl.trainer import utils

    init = _code(GRPOTrainer.__init__)
    for statement in [
        "if not supports_tool_calling(processing_class):",
        "processing_class = add_response_schema(processing_class)",
        "if self.tools and not is_chat_template_prefix_preserving(processing_class): "
        "self.chat_template = get_training_chat_template(processing_class)",
        'elif member_name == "get_reward": has_reward = True',
        "return [e.get_reward() if type(e) is _env_type else None for e in environments]",
        "self.reward_weights = torch.cat([self.reward_weights, torch.ones(1)])",
    ]:
        assert statement in init, f"GRPOTrainer.__init__ no longer has {statement!r}"
    score = _code(GRPOTrainer._generate_and_score_completions)
    for statement in [
        'prompts = [x.get("prompt", [{"role": "user", "content": ""}]) for x in inputs]',
        "if index == len(pool): pool.append(self.environment_factories[name]())",
        'if member_name not in ("reset", "get_reward") and not member_name.startswith("_")',
        "if inspect.iscoroutinefunction(tool): async_tool_dict[tool.__name__] = tool",
        'reset_kwargs = {k: v for k, v in x.items() if k != "environment"} if self._multi_environment else x',
        'prompts[i] = prompt[:-1] + [{**prompt[-1], "content": content + observation}]',
    ]:
        assert statement in score, f"GRPOTrainer._generate_and_score_completions no longer has {statement!r}"
    assert 'reward_kwargs["environments"] = self.environments' in _code(GRPOTrainer._calculate_rewards)
    async_init = _code(AsyncGRPOTrainer.__init__)
    for statement in [
        'raise ValueError("`train_dataset` is required unless an `environment_factory` is provided.")',
        "A `dict` `environment_factory` (multiple environments) requires a `train_dataset`",
        "`max_steps` must be set to a positive value to define the training length.",
        "num_placeholder_rows = args.per_device_train_batch_size * args.gradient_accumulation_steps",
        'train_dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * num_placeholder_rows})',
    ]:
        assert statement in async_init, f"AsyncGRPOTrainer.__init__ no longer has {statement!r}"
    given = async_init.index("self.rollout_worker = rollout_worker")
    assert given < async_init.index("tools=tools, environment_factory=environment_factory,")
    for function, params in [
        (chat_template_utils.supports_tool_calling, ["processing_class"]),
        (chat_template_utils.add_response_schema, ["processing_class"]),
        (chat_template_utils.is_chat_template_prefix_preserving, ["processing_class"]),
        (utils.start_event_loop_in_daemon, ["name"]),
        (utils.shutdown_event_loop_in_daemon, ["thread", "loop"]),
    ]:
        assert list(inspect.signature(function).parameters) == params, function.__name__
    assert list(inspect.signature(chat_template_utils.get_training_chat_template).parameters)[0] == "processing_class"
