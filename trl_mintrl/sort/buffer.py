"""SORT's deferred buffer of all-wrong prompts, and the all-wrong / all-right test on a batch's rewards.

The buffer is training state: it is identical on every process (each applies the same gathered additions and
removals in the same order), so "repair now" is the same decision everywhere, and it is saved with checkpoints as JSON
(`BUFFER_FILE`, written and read by the trainer's `GRPOTrainerBase`). It is bounded: past `capacity` the oldest item
is evicted, so a backlog of failures the repair cannot keep up with ages out instead of growing without end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

BUFFER_FILE = "sort_buffer.json"
_STATE_VERSION = 3  # 2: items carry `deferred_at`, 3: and `environment`; earlier versions (without them) still load


def correctness_scores(rewards_per_func: torch.Tensor, weights: torch.Tensor, funcs: list[int]) -> torch.Tensor:
    """(rows,) weighted sum of the rewards of the functions that decide correctness; NaN where all of them are None.

    Args:
        rewards_per_func: (rows, reward functions), NaN where a function returned None.
        weights: (reward functions,) the trainer's `reward_weights`.
        funcs: indices of the correctness functions (`SORTConfig.correctness_reward_funcs`, resolved).
    """
    chosen = rewards_per_func[:, funcs]
    scores = (chosen * weights.to(chosen.device)[funcs].unsqueeze(0)).nansum(dim=1)
    scores[torch.isnan(chosen).all(dim=1)] = torch.nan
    return scores


def classify_groups(
    scores: torch.Tensor, num_generations: int, threshold: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(all_wrong, all_right) booleans per group of `num_generations` consecutive rows.

    `scores` are the correctness scores of each rollout (`correctness_scores`, NaN = unscorable); a rollout is
    correct when its score exceeds `threshold`. A group is all-wrong when no rollout is correct and all-right when
    every rollout is; an unscorable rollout is neither, so a group with one is never deferred: its prompt may lack a
    checkable answer.
    """
    if scores.numel() % num_generations:
        raise ValueError(f"{scores.numel()} rewards do not split into groups of num_generations={num_generations}")
    grouped = scores.view(-1, num_generations)
    return (grouped <= threshold).all(dim=1), (grouped > threshold).all(dim=1)


def solved_groups(scores: torch.Tensor, num_generations: int, threshold: float = 0.0) -> torch.Tensor:
    """Booleans per group: some rollout is correct (score above `threshold`; NaN never is). A buffered prompt whose
    group is solved leaves the buffer: the policy no longer needs its reference."""
    return (scores.view(-1, num_generations) > threshold).any(dim=1)


def resolve_reward_funcs(selection: list[str | int] | None, names: list[str]) -> list[int]:
    """Indices of the reward functions `selection` names (names as TRL logs them, or indices; None: all)."""
    if selection is None:
        return list(range(len(names)))
    indices = []
    for entry in selection:
        if isinstance(entry, int) or (isinstance(entry, str) and entry.isdigit() and entry not in names):
            index = int(entry)
            if not 0 <= index < len(names):
                raise ValueError(
                    f"`correctness_reward_funcs` has index {index}, but there are {len(names)} reward functions "
                    f"{names}; use an index from 0 to {len(names) - 1} or a name."
                )
        elif entry in names:
            index = names.index(entry)
        else:
            raise ValueError(
                f"`correctness_reward_funcs` names {entry!r}, which is not a reward function of this trainer; the "
                f"reward functions are {names} (by name, or index 0 to {len(names) - 1})."
            )
        if index in indices:
            raise ValueError(f"`correctness_reward_funcs` names reward function {names[index]!r} twice.")
        indices.append(index)
    return indices


@dataclass(frozen=True)
class RepairItem:
    """A deferred prompt (as the policy saw it: a string or a list of messages, with an environment's first
    observation), its reference solution (a string or a conversation), the optimizer step (`global_step`) at which it
    was deferred (its age at repair is logged), and the environment whose tools its prompt showed (None: the single
    environment, or none)."""

    prompt: str | list[dict]
    reference: str | list[dict]
    deferred_at: int = 0
    environment: str | None = None


def _key(prompt: str | list[dict]) -> str:
    try:
        return json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    except TypeError as err:
        raise ValueError(f"SORT keeps prompts as JSON; this prompt is not JSON-serialisable ({err}).") from err


class RepairBuffer:
    """FIFO of `RepairItem`s with at most one item per prompt and at most `capacity` items (None: unbounded), plus the
    running counters logged as `sort/*`."""

    COUNTERS = (
        "repairs",
        "empty_references",
        "truncated_references",
        "failed_plans",
        "evictions",  # oldest items dropped to stay within `capacity`
        "solved_removed",  # items dropped because their prompt was sampled again and solved
    )

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self._items: list[RepairItem] = []
        self._keys: set[str] = set()
        self.counters = dict.fromkeys(self.COUNTERS, 0)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def items(self) -> list[RepairItem]:
        return list(self._items)

    def holds(self, prompt: str | list[dict]) -> bool:
        return _key(prompt) in self._keys

    def add(
        self,
        prompt: str | list[dict],
        reference: str | list[dict],
        deferred_at: int = 0,
        environment: str | None = None,
    ) -> bool:
        """Append unless the prompt is already held, evicting the oldest items past `capacity` (counted); returns
        whether it was added."""
        key = _key(prompt)
        if key in self._keys:
            return False
        self._keys.add(key)
        self._items.append(RepairItem(prompt, reference, deferred_at, environment))
        if self.capacity is not None and len(self._items) > self.capacity:
            self.counters["evictions"] += len(self.pop(len(self._items) - self.capacity))
        return True

    def remove_solved(self, prompt: str | list[dict]) -> bool:
        """Drop the prompt's item (counted in `solved_removed`); returns whether one was held."""
        key = _key(prompt)
        if key not in self._keys:
            return False
        self._keys.remove(key)
        self._items = [item for item in self._items if _key(item.prompt) != key]
        self.counters["solved_removed"] += 1
        return True

    def pop(self, n: int) -> list[RepairItem]:
        """Remove and return the `n` oldest items (fewer if fewer are held)."""
        taken, self._items = self._items[:n], self._items[n:]
        self._keys.difference_update(_key(item.prompt) for item in taken)
        return taken

    def state_dict(self) -> dict:
        return {"version": _STATE_VERSION, "items": [asdict(i) for i in self._items], "counters": dict(self.counters)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a saved buffer; a version-1 state (before items carried `deferred_at`) loads with age origin 0. Items
        beyond this buffer's `capacity` (a run resumed with a smaller one) are evicted, oldest first, and counted."""
        if state.get("version") not in range(1, _STATE_VERSION + 1):
            raise ValueError(f"unsupported SORT buffer state version {state.get('version')!r}")
        self._items, self._keys = [], set()
        self.counters = {**dict.fromkeys(self.COUNTERS, 0), **state["counters"]}
        for item in state["items"]:
            self.add(item["prompt"], item["reference"], item.get("deferred_at", 0), item.get("environment"))
