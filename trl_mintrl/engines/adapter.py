"""An engine view of the policy with its PEFT adapter disabled: the `base` judge's engine, as in the paper's self-intervention ablation (docs/judges.md)."""

from __future__ import annotations

import contextlib

from .base import GenerationEngine


class AdapterDisabledEngine(GenerationEngine):
    """The policy's engine generating with its PEFT adapter disabled: the initial weights, same module, no copy."""

    def __init__(self, policy_engine: GenerationEngine, peft_model):
        super().__init__(policy_engine.eos_token_ids)
        self.policy_engine = policy_engine
        self.peft_model = peft_model

    def _open_session(self):
        return self.policy_engine.session()

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        # the base weights compute other keys and values for the same ids: a cache-keeping engine keeps them apart
        cache_scope = getattr(self.policy_engine, "cache_scope", None)
        scope = cache_scope("adapter-disabled") if cache_scope else contextlib.nullcontext()
        with self.peft_model.disable_adapter(), scope:
            return self.policy_engine.generate(prompt_ids, max_new_tokens, temperature)
