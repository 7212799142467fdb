"""Per-row key/value caches that a `TransformersEngine` keeps between the calls of one session.

A chunked rollout asks the engine, chunk after chunk, for `prompt + completion so far`. Each row of a call leaves
its keys and values behind (one `CachedRow`, keyed by the token ids they were computed from); the next request whose
ids share a prefix with a kept row prefills only what follows that prefix: an accepted chunk continues from its
row, a row the judge cut keeps its cache up to the cut (the longest common prefix) and reads only the judge's
tokens. Rows of one call with different cached lengths share one batch, laid out per row as

    [pad] [cached prefix] [pad] [new tokens]  ->  generated tokens

the two pad runs masked out of attention, so that each row's position ids (counted over its unmasked tokens, as
`generate` does from the attention mask) are those of an unpadded forward pass of its ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class CachedRow:
    """The keys and values of one sequence: `ids` (in order), one `(keys, values)` pair per layer, each
    `[kv_heads, len(ids), head_dim]`. `prompt_length`: the length of the request that produced the row; a later
    request sharing all of it continues this row (the row is then dropped), one sharing less (a judge prompt with the
    same system prefix) only borrows from it."""

    ids: np.ndarray
    prompt_length: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    scope: object
    last_used: int


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass
class Layout:
    """Where each row's tokens sit in the batch: `cached` columns of cache (row i's last `reused[i]` of them
    hold its reused prefix), then `new` columns of input (row i's last `fresh[i]` of them hold the tokens it reads)."""

    cached: int
    new: int
    reused: list[int]
    fresh: list[int]

    def row_columns(self, row: int, generated: int) -> list[int]:
        """The batch columns of row `row`'s cached prefix, new tokens and first `generated` generated tokens."""
        c, n, r, f = self.cached, self.new, self.reused[row], self.fresh[row]
        return [*range(c - r, c), *range(c + n - f, c + n), *range(c + n, c + n + generated)]


class RowCachePool:
    """The kept rows of one session. A row not used (continued or borrowed from) for `max_idle_calls` engine calls
    is dropped: those of finished trajectories and of judge prompts nobody continues. A rollout whose policy calls
    alternate with a self-judge's review and correction calls continues its rows every third call."""

    def __init__(self, max_idle_calls: int = 4):
        self.max_idle_calls = max_idle_calls
        self.rows: list[CachedRow] = []
        self.calls = 0

    def clear(self) -> None:
        self.rows = []
        self.calls = 0

    def match(self, requests: list[list[int]], scope: object) -> list[tuple[CachedRow | None, int]]:
        """For each request, the kept row sharing its longest prefix and how many of its tokens to reuse (at least
        one token is left to read: the forward pass that gives the next token's logits)."""
        self.calls += 1
        matches = []
        for request in requests:
            ids, best, reuse = np.asarray(request, dtype=np.int64), None, 0
            for row in self.rows:
                if row.scope == scope and (n := min(common_prefix(ids, row.ids), len(ids) - 1)) > reuse:
                    best, reuse = row, n
            if best is not None:
                best.last_used = self.calls
            matches.append((best, reuse))
        return matches

    def update(self, matches: list[tuple[CachedRow | None, int]], new_rows: list[CachedRow]) -> None:
        """Keep this call's rows; drop the rows they continue and those idle for too long."""
        continued = {id(row) for row, reuse in matches if row is not None and reuse >= row.prompt_length}
        self.rows = [
            row for row in self.rows if id(row) not in continued and self.calls - row.last_used < self.max_idle_calls
        ] + new_rows

    def tokens(self) -> int:
        return sum(len(row.ids) for row in self.rows)


def layout_batch(
    requests: list[list[int]], matches: list[tuple[CachedRow | None, int]], pad_token_id: int
) -> tuple[Layout, torch.Tensor, torch.Tensor]:
    """The batch's layout, input ids and attention mask (both `[rows, cached + new]`, on the CPU)."""
    reused = [reuse for _, reuse in matches]
    fresh = [len(ids) - reuse for ids, reuse in zip(requests, reused, strict=True)]
    layout = Layout(max(reused, default=0), max(fresh, default=0), reused, fresh)
    width = layout.cached + layout.new
    input_ids = torch.full((len(requests), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(requests):
        columns = layout.row_columns(i, 0)
        if columns:
            input_ids[i, columns] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, columns] = 1
    return layout, input_ids, attention_mask


def batch_cache_layers(
    matches: list[tuple[CachedRow | None, int]], layout: Layout, device
) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per layer, the batch's `[rows, kv_heads, cached, head_dim]` keys and values: each row's reused prefix
    right-aligned, zeros (masked out) before it. None when nothing is reused."""
    if layout.cached == 0:
        return None
    sample = next(row for row, reuse in matches if reuse > 0)
    layers = []
    for layer, (keys, values) in enumerate(sample.layers):
        shape = (len(matches), keys.shape[0], layout.cached, keys.shape[-1])
        batch_keys = torch.zeros(shape, dtype=keys.dtype, device=device)
        batch_values = torch.zeros(shape, dtype=values.dtype, device=device)
        for i, (row, reuse) in enumerate(matches):
            if reuse:
                batch_keys[i, :, layout.cached - reuse :] = row.layers[layer][0][:, :reuse]
                batch_values[i, :, layout.cached - reuse :] = row.layers[layer][1][:, :reuse]
        layers.append((batch_keys, batch_values))
    return layers


def harvest_rows(
    cache_layers: list,
    layout: Layout,
    requests: list[list[int]],
    completions: list[list[int]],
    scope: object,
    calls: int,
) -> list[CachedRow]:
    """One `CachedRow` per row from the batch cache's layers (`DynamicLayer`s) after `generate`: its request and
    the generated tokens the model read (all but the last one generated, which no forward pass has seen; nothing
    after the row stopped). Each batch layer is released once copied, so the copies never double the cache."""
    steps = cache_layers[0].keys.shape[-2] - layout.cached - layout.new  # generated tokens that were read back
    device = cache_layers[0].keys.device
    reads = [min(len(completion), steps) for completion in completions]
    index = [
        torch.tensor(layout.row_columns(i, read), dtype=torch.long, device=device) for i, read in enumerate(reads)
    ]
    kept: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in requests]
    for layer in cache_layers:
        for i, columns in enumerate(index):
            kept[i].append((layer.keys[i].index_select(-2, columns), layer.values[i].index_select(-2, columns)))
        layer.reset()
    return [
        CachedRow(np.asarray(request + completion[:read], dtype=np.int64), len(request), layers, scope, calls)
        for request, completion, read, layers in zip(requests, completions, reads, kept, strict=True)
    ]
