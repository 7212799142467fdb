"""SORT's deferred buffer of all-wrong prompts, and the all-wrong / all-right test on a batch's rewards.

The buffer is training state: it is identical on every process (each appends the same gathered items in the same
order), so "repair now" is the same decision everywhere, and it is saved with checkpoints as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

BUFFER_FILE = "sort_buffer.json"
_STATE_VERSION = 1


def classify_groups(rewards: torch.Tensor, num_generations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(all_wrong, all_right) booleans per group of `num_generations` consecutive rows.

    `rewards` are the weighted rewards of each rollout (NaN where every reward function returned None). A group is
    all-wrong when every rollout scored exactly 0 and all-right when every rollout scored above 0; an unscorable (NaN)
    rollout is neither, so a group with one is never deferred: its prompt may lack a checkable answer.
    """
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}")
    grouped = rewards.view(-1, num_generations)
    return (grouped == 0).all(dim=1), (grouped > 0).all(dim=1)


@dataclass(frozen=True)
class RepairItem:
    """A deferred prompt (as in the dataset: a string or a list of messages) and its reference solution."""

    prompt: str | list[dict]
    reference: str


def _key(prompt: str | list[dict]) -> str:
    try:
        return json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    except TypeError as err:
        raise ValueError(f"SORT keeps prompts as JSON; this prompt is not JSON-serialisable ({err}).") from err


class RepairBuffer:
    """FIFO of `RepairItem`s with at most one item per prompt, plus the running counters logged as `sort/*`."""

    COUNTERS = ("repairs", "empty_references", "truncated_references")

    def __init__(self):
        self._items: list[RepairItem] = []
        self._keys: set[str] = set()
        self.counters = dict.fromkeys(self.COUNTERS, 0)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def items(self) -> list[RepairItem]:
        return list(self._items)

    def add(self, prompt: str | list[dict], reference: str) -> bool:
        """Append unless the prompt is already held; returns whether it was added."""
        key = _key(prompt)
        if key in self._keys:
            return False
        self._keys.add(key)
        self._items.append(RepairItem(prompt, reference))
        return True

    def pop(self, n: int) -> list[RepairItem]:
        """Remove and return the `n` oldest items (fewer if fewer are held)."""
        taken, self._items = self._items[:n], self._items[n:]
        self._keys.difference_update(_key(item.prompt) for item in taken)
        return taken

    def state_dict(self) -> dict:
        return {"version": _STATE_VERSION, "items": [asdict(i) for i in self._items], "counters": dict(self.counters)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported SORT buffer state version {state.get('version')!r}")
        self._items, self._keys = [], set()
        for item in state["items"]:
            self.add(item["prompt"], item["reference"])
        self.counters = {**dict.fromkeys(self.COUNTERS, 0), **state["counters"]}

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / BUFFER_FILE
        path.write_text(json.dumps(self.state_dict(), ensure_ascii=False))
        return path

    def load(self, directory: str | Path) -> bool:
        """Restore from a checkpoint folder; returns False when it holds no SORT buffer."""
        path = Path(directory) / BUFFER_FILE
        if not path.exists():
            return False
        self.load_state_dict(json.loads(path.read_text()))
        return True
