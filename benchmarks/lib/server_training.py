"""Training against a vLLM server on a CPU, the same way for synchronous and asynchronous trainers: the weights
synced through the disk (`disk_synced`: TRL's NCCL sync cannot run on a CPU), and how stale each trained rollout was
(`StalenessRecorder`, `staleness_text`): the weight version training it minus the version that wrote it."""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path
from unittest import mock

from benchmarks.lib.vllm_server import HTTP_TIMEOUT_S


def disk_synced(trainer, server_url: str, folder: Path):
    """Replace TRL's server-mode `VLLMGeneration.sync_weights` (NCCL, impossible on CPU) by the asynchronous
    trainers' disk sync, called the way `AsyncGRPOTrainer._sync_weight_merged` calls it: pause, the weights streamed
    under vLLM's names (TRL's own iterator), resume. Returns the transfer (`init_weight_transfer` done)."""
    from trl_mintrl.mintrl.async_.transfer import DiskReloadTransfer

    vg = trainer.vllm_generation
    transfer = DiskReloadTransfer(server_url, folder, reload_timeout=HTTP_TIMEOUT_S)
    transfer.bind(trainer.accelerator.unwrap_model(trainer.model))
    transfer.init_weight_transfer()

    def sync_weights():
        transfer.pause()
        try:
            transfer.send_weights(vg._iter_named_params())
        finally:
            transfer.resume()

    vg.sync_weights = sync_weights
    return transfer


class StalenessRecorder:
    """Per trained micro-batch, the weight version training it minus the version that wrote each of its samples.

    Each sample's version is read where the trainer takes it off the worker's queue; its metrics dict travels by
    reference through TRL's dataset into the packed rows the collator sees, which identifies it there. The collator
    runs one micro-batch ahead of the loss (accelerate's dispatcher), so collated batches wait in a FIFO until the
    loss trains them, with the trainer's `model_version` at that moment."""

    def __init__(self, trainer, collator_cls):
        self.trainer = trainer
        self.collator_cls = collator_cls
        self.pending: dict[int, tuple[dict, int]] = {}  # id(metrics) -> (metrics, version); the ref keeps the id
        self.collated: collections.deque[list[int]] = collections.deque()
        self.per_step: list[dict] = []  # {"step", "staleness": [..]}
        queue = trainer.rollout_queue
        get = queue.get

        def recording_get(*args, **kwargs):
            sample = get(*args, **kwargs)
            self.pending[id(sample.metrics)] = (sample.metrics, sample.model_version)
            return sample

        queue.get = recording_get
        compute_loss = trainer.compute_loss

        def recording_loss(model, inputs, *args, **kwargs):
            versions = self.collated.popleft()
            self.per_step.append(
                {"step": trainer.state.global_step, "staleness": [trainer.model_version - v for v in versions]}
            )
            return compute_loss(model, inputs, *args, **kwargs)

        trainer.compute_loss = recording_loss

    @contextlib.contextmanager
    def collating(self):
        torch_call = self.collator_cls.torch_call
        recorder = self

        def recording_call(collator, examples):
            (rows,) = examples
            recorder.collated.append([recorder.pending.pop(id(s["metrics"]))[1] for row in rows for s in row.samples])
            return torch_call(collator, examples)

        with mock.patch.object(self.collator_cls, "torch_call", recording_call):
            yield


def staleness_text(runs: list[dict], none: str) -> str:
    """The runs' trained staleness histograms together, as each staleness's share of the trained rollouts (`0: 1%,
    1: 99%`); `none` when no run recorded any (synchronous arms)."""
    total = collections.Counter()
    for run in runs:
        total.update({int(k): v for k, v in (run["staleness"] or {}).items()})
    n = sum(total.values())
    if not n:
        return none
    return ", ".join(f"{k}: {100 * v / n:.0f}%" for k, v in sorted(total.items()))
