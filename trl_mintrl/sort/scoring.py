"""How SORT's repair scores reference tokens: at temperature 1.0 through TRL's fused, tiled LM head
(`add_unit_temperature_head`), and only on the tokens it learns (`learned_mask`: a conversation's tool results and
template tokens are not)."""

from __future__ import annotations

import functools
import types

import torch
from trl.trainer.utils import add_fused_lm_head

from .references import Reference


def learned_mask(references: list[Reference], like: torch.Tensor) -> torch.Tensor:
    """(B, R) 1 on the reference tokens the repair learns, 0 on a conversation's tool results and template tokens
    (and on padding), laid out like the repair's reference mask `like`."""
    learned = torch.zeros_like(like)
    for row, reference in enumerate(references):
        learned[row, : len(reference.ids)] = 1.0 if reference.learned is None else torch.tensor(reference.learned)
    return learned


def add_unit_temperature_head(model, cast_lm_head_to_fp32: bool) -> None:
    """Let `model(..., labels=labels, fused_lm_head=True, score_at_unit_temperature=True)` return TRL's fused, tiled
    per-token log-probs at temperature 1.0, which SORT's scoring needs, next to TRL's own fused head (added by
    `GRPOTrainer.__init__` at the sampling temperature), which every other call keeps using.

    TRL's head divides by the temperature it was added with, and the alternative, the model's logits normalised here,
    builds (rows, length, vocabulary) logits (about 2.5 GB in fp32 per 4k-token row at a 152k vocabulary). Both heads
    look the backbone and the LM head up on each call, and the flag travels through DDP, DeepSpeed and PEFT like
    `fused_lm_head` does.
    """
    sampling_forward = model.forward
    add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=cast_lm_head_to_fp32)
    unit_forward = model.forward

    @functools.wraps(type(model).forward)  # `generate` validates its kwargs against this signature
    def forward(self, *args, score_at_unit_temperature=False, **kwargs):
        return (unit_forward if score_at_unit_temperature else sampling_forward)(*args, **kwargs)

    model.forward = types.MethodType(forward, model)
