"""What TRL's `AsyncGRPOTrainer` needs to run off CUDA (CPU tests, the CPU benchmark), and nothing more.

Two places in TRL assume a CUDA device:
- `AsyncGRPOTrainer.__init__` calls `get_peak_flops_per_device`, which asks `torch.cuda` for the device name, so the
  constructor fails on CPU. The value only feeds the MFU metric, which TRL already skips when it is `None`.
- The model runs with `attn_implementation="tree_fa3"`, TRL's tree attention over the packed prefix trie, which calls
  the FlashAttention-3 kernel fetched from the Hub. Off CUDA one SDPA call with an explicit mask computes the same.

On CUDA both shims hand over to TRL unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.flash_attention import get_target_dtype
from trl.experimental.async_grpo import async_grpo_trainer, packing


@contextlib.contextmanager
def peak_flops_unknown_off_cuda() -> Iterator[None]:
    """Within the block, TRL's trainer module sees a `get_peak_flops_per_device` that returns `None` off CUDA.

    Wrap `AsyncGRPOTrainer.__init__` in it: the call sits mid-constructor, so there is no method to override, and the
    patch is of the name the trainer module imported, restored on exit, so nothing else sees it.
    """
    original = async_grpo_trainer.get_peak_flops_per_device

    def peak_flops_or_none(accelerator, dtype: str) -> float | None:
        return original(accelerator, dtype) if accelerator.device.type == "cuda" else None

    async_grpo_trainer.get_peak_flops_per_device = peak_flops_or_none
    try:
        yield
    finally:
        async_grpo_trainer.get_peak_flops_per_device = original


def tree_attention_any_device(
    module,
    query,
    key,
    value,
    attention_mask,
    *,
    tree_kv_index,
    tree_cu_seqlens_q,
    tree_cu_seqlens_k,
    tree_max_seqlen_q,
    tree_max_seqlen_k,
    scaling=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """TRL's `packing.tree_attention` on CUDA; elsewhere the same result from one SDPA call.

    TRL's packed row holds `S` segments of the prefix trie; segment `s` (queries `cu_seqlens_q[s]:cu_seqlens_q[s+1]`)
    attends to the K/V of its root-to-segment path, the packed positions `tree_kv_index[cu_seqlens_k[s]:
    cu_seqlens_k[s+1]]`, which end with the segment itself. The kernel runs that varlen and causal, and FlashAttention
    aligns a causal mask to the bottom right when a segment has fewer queries than keys: the `i`-th query of a
    segment with `len_q` queries and `len_k` keys sees keys `0 .. i + len_k - len_q` of its path (its own position on
    the path and everything before it), and with a sliding window only the last `sliding_window` of those. Here the
    gathered K/V of all paths are laid end to end and a block-diagonal `(N, K)` bool mask encodes exactly that.
    The mask is O(N*K): meant for tests and small CPU runs. Like TRL, `dropout` is ignored and no weights are
    returned; `tree_max_seqlen_*` only size the CUDA kernel's work.
    """
    if query.is_cuda:
        return packing.tree_attention(
            module,
            query,
            key,
            value,
            attention_mask,
            tree_kv_index=tree_kv_index,
            tree_cu_seqlens_q=tree_cu_seqlens_q,
            tree_cu_seqlens_k=tree_cu_seqlens_k,
            tree_max_seqlen_q=tree_max_seqlen_q,
            tree_max_seqlen_k=tree_max_seqlen_k,
            scaling=scaling,
            sliding_window=sliding_window,
            softcap=softcap,
            **kwargs,
        )
    if softcap:
        raise NotImplementedError(
            f"Tree attention off CUDA does not support attention logit soft-capping (softcap={softcap}); "
            f"{type(module).__name__} needs TRL's FlashAttention-3 path on a CUDA device."
        )
    dtype = get_target_dtype(query, module) or query.dtype  # TRL's cast, so both paths compute in the same dtype
    # (1, heads, N, d) as transformers passes them; K/V gathered along the paths: (1, kv_heads, K, d).
    query, key, value = (x.to(dtype) for x in (query, key, value))
    key, value = (x.index_select(2, tree_kv_index) for x in (key, value))
    mask = _tree_mask(tree_cu_seqlens_q, tree_cu_seqlens_k, query.shape[2], key.shape[2], sliding_window)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _tree_mask(
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, n_queries: int, n_keys: int, sliding_window: int | None
) -> torch.Tensor:
    """`(n_queries, n_keys)` bool: query `n` may attend to gathered key `k` (see `tree_attention_any_device`)."""
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    q_pos = torch.arange(n_queries, device=cu_q.device)
    k_pos = torch.arange(n_keys, device=cu_k.device)
    q_segment = torch.searchsorted(cu_q[1:], q_pos, right=True)
    k_segment = torch.searchsorted(cu_k[1:], k_pos, right=True)
    path_len, segment_len = cu_k.diff(), cu_q.diff()
    # Index of each query on its own path, and of each gathered key on the path it was gathered for.
    q_on_path = q_pos - cu_q[q_segment] + (path_len - segment_len)[q_segment]
    k_on_path = k_pos - cu_k[k_segment]
    distance = q_on_path[:, None] - k_on_path[None, :]
    mask = (q_segment[:, None] == k_segment[None, :]) & (distance >= 0)
    if sliding_window:
        mask &= distance < sliding_window
    return mask


def install_cpu_shims() -> None:
    """Register `tree_attention_any_device` under TRL's tree-attention name ("tree_fa3").

    `AsyncGRPOTrainer.__init__` registers TRL's own function each time it runs, so call this after constructing the
    trainer. The registry is global, but the function only differs from TRL's off CUDA. TRL's registration (its
    mask function included) runs first, so this also works without a trainer (tests forwarding a packed row).
    """
    packing.register_tree_attention()
    AttentionInterface.register(packing.TREE_ATTENTION, tree_attention_any_device)
