"""A stand-in trainer as `benchmarks.lib.step_cost.measure_time` drives one: its callbacks at each optimizer step's
boundaries, no model training."""

from __future__ import annotations

import types
from collections.abc import Callable


class StandInTrainer:
    """`train()` runs `set_up()`, then `steps` steps of `step()` between the callbacks' `on_step_begin` and
    `on_step_end`, then `on_train_end`."""

    def __init__(self, steps: int, model, step: Callable[[], None], set_up: Callable[[], None] = lambda: None):
        self.steps, self.model, self.step, self.set_up, self.callbacks = steps, model, step, set_up, []

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def train(self):
        self.set_up()
        state = types.SimpleNamespace(global_step=0)
        for _ in range(self.steps):
            for callback in self.callbacks:
                callback.on_step_begin(None, state, None)
            self.step()
            state.global_step += 1
            for callback in self.callbacks:
                callback.on_step_end(None, state, None)
        for callback in self.callbacks:
            callback.on_train_end(None, state, None)
