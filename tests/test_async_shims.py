"""The async trainer's CPU shims (tree attention without FlashAttention-3, the peak-FLOPs lookup) and the disk weight
transfer against a recording stand-in for `vllm serve`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from trl.experimental.async_grpo import async_grpo_trainer, packing
from trl.trainer.utils import add_fused_lm_head

from trl_mintrl.engines.vllm_http import wait_for_health
from trl_mintrl.mintrl.async_.cpu_shims import (
    install_cpu_shims,
    peak_flops_unknown_off_cuda,
    tree_attention_any_device,
)
from trl_mintrl.mintrl.async_.transfer import DiskReloadTransfer, tied_parameter_names

# ---------------------------------------------------------------------------------------------------------------
# Tree attention

PROMPT_A, PROMPT_B = [11, 12, 13, 14], [21, 22, 23]
# Rollouts as TRL's trie packs them: a shared prompt per group, completions that fork at different depths, one
# completion that is a prefix of another (the trie forks one token early), and a second group in the same row.
SHARED_ROWS = [
    (PROMPT_A, [5, 6, 7], 0),
    (PROMPT_A, [5, 6, 8, 9], 0),
    (PROMPT_A, [3], 0),
    (PROMPT_A, [5, 6, 7, 2], 0),
    (PROMPT_B, [4, 4], 1),
    (PROMPT_B, [4, 5, 6], 1),
]
UNSHARED_ROWS = [(PROMPT_A, [5, 6], 0), (PROMPT_B, [7, 8, 9], 1)]


def packed_row(rollouts, *, train_prompt: bool = False) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """TRL's own `TreeRow` over the rollouts: the samples and `pack()`'s tensors. With `train_prompt`, every
    position after the first is a loss term, so `token_index` reaches every non-final position of every sample."""
    row = packing.TreeRow()
    for prompt, completion, group_id in rollouts:
        ids = np.array(prompt + completion)
        trained = np.ones(len(ids)) if train_prompt else np.array([0] * len(prompt) + [1] * len(completion))
        sample = {"input_ids": ids, "completion_mask": trained, "old_log_probs": np.zeros(len(ids))}
        row.add({**sample, "advantage": 0.0, "group_id": group_id})
    return row.samples, row.pack()


def tree_kwargs(packed: dict[str, torch.Tensor]) -> dict:
    """The model kwargs `AsyncGRPOTrainer.compute_loss` builds from a packed row."""
    kwargs = {key: packed[key] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    kwargs["tree_max_seqlen_q"], kwargs["tree_max_seqlen_k"] = packed["tree_max_seqlens"].tolist()
    return kwargs


def causal_attention(q, k, v, scale: float, sliding_window: int | None) -> torch.Tensor:
    """One sequence, by the definition: q `(L, H, d)`, k/v `(L, H_kv, d)`; query head h reads K/V head
    h // (H / H_kv)."""
    k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    i = torch.arange(q.shape[0])
    allowed = i[:, None] >= i[None, :]
    if sliding_window:
        allowed &= i[:, None] - i[None, :] < sliding_window
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("rollouts", [SHARED_ROWS, UNSHARED_ROWS], ids=["shared-prefixes", "nothing-shared"])
@pytest.mark.parametrize(("scaling", "sliding_window"), [(None, None), (0.3, 3)])
def test_cpu_tree_attention_equals_per_sequence_attention(rollouts, scaling, sliding_window):
    heads, kv_heads, head_dim, vocab, max_len = 4, 2, 8, 32, 16
    gen = torch.Generator().manual_seed(0)
    # Features depend on (token, position) only, so each sample's own q/k/v follow from its tokens alone.
    q_table = torch.randn(vocab, max_len, heads, head_dim, generator=gen, dtype=torch.float64)
    k_table, v_table = (
        torch.randn(vocab, max_len, kv_heads, head_dim, generator=gen, dtype=torch.float64) for _ in "kv"
    )
    samples, packed = packed_row(rollouts, train_prompt=True)
    if rollouts is SHARED_ROWS:
        assert len(packed["input_ids"]) < sum(len(s["input_ids"]) for s in samples)  # the trie did share

    ids, pos = packed["input_ids"], packed["position_ids"]
    q, k, v = (table[ids, pos].transpose(0, 1).unsqueeze(0) for table in (q_table, k_table, v_table))
    out, weights = tree_attention_any_device(
        None, q, k, v, None, scaling=scaling, sliding_window=sliding_window, **tree_kwargs(packed)
    )
    assert weights is None and out.shape == (1, len(ids), heads, head_dim)

    expected = []
    for sample in samples:
        sample_ids = torch.as_tensor(sample["input_ids"])
        at = torch.arange(len(sample_ids))
        per_sample = causal_attention(
            q_table[sample_ids, at], k_table[sample_ids, at], v_table[sample_ids, at],
            head_dim**-0.5 if scaling is None else scaling, sliding_window,
        )  # fmt: skip
        expected.append(per_sample[:-1])  # the loss terms of position p read the output at p - 1
    torch.testing.assert_close(out[0, packed["token_index"]], torch.cat(expected), atol=1e-6, rtol=0)


def test_cpu_tree_attention_refuses_softcap():
    _, packed = packed_row(UNSHARED_ROWS)
    n = len(packed["input_ids"])
    q, k, v = torch.zeros(1, 2, n, 4), torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4)
    with pytest.raises(NotImplementedError, match="softcap=30.0"):
        tree_attention_any_device(None, q, k, v, None, softcap=30.0, **tree_kwargs(packed))


def test_install_cpu_shims_replaces_trls_registration():
    packing.register_tree_attention()  # what every AsyncGRPOTrainer.__init__ does
    assert ALL_ATTENTION_FUNCTIONS[packing.TREE_ATTENTION] is packing.tree_attention
    install_cpu_shims()
    assert ALL_ATTENTION_FUNCTIONS[packing.TREE_ATTENTION] is tree_attention_any_device


def test_packed_forward_log_probs_equal_per_sequence_forward(tiny_model_path):
    """The tiny model through `compute_loss`'s packed path (tree kwargs, fused LM head) with the shim gives every loss
    term the log-probability a plain forward of its own sequence gives. Both run in float64 up to TRL's fused head,
    which scores in float32 either way."""
    install_cpu_shims()
    models = {}
    for attention in (packing.TREE_ATTENTION, "eager"):
        models[attention] = AutoModelForCausalLM.from_pretrained(
            tiny_model_path, dtype=torch.float64, attn_implementation=attention
        )
        add_fused_lm_head(models[attention], outputs=("log_probs",))
    samples, packed = packed_row(SHARED_ROWS)

    with torch.no_grad():
        outputs = models[packing.TREE_ATTENTION](
            input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
            shift_labels=packed["shift_labels"][None], fused_lm_head=True, **tree_kwargs(packed),
        )  # fmt: skip
        packed_log_probs = outputs.log_probs.flatten()[packed["token_index"]]
        expected = []
        for sample in samples:
            ids, trained = torch.as_tensor(sample["input_ids"]), torch.as_tensor(sample["completion_mask"]).bool()
            labels = ids.masked_fill(~trained, -100)
            log_probs = models["eager"](input_ids=ids[None], labels=labels[None], fused_lm_head=True).log_probs[0]
            expected.append(log_probs[trained[1:]])  # log_probs[p - 1] scores ids[p]
    torch.testing.assert_close(packed_log_probs, torch.cat(expected), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Peak FLOPs


def test_peak_flops_patch_is_scoped(monkeypatch):
    calls = []

    def trl_lookup(accelerator, dtype):
        calls.append((accelerator.device.type, dtype))
        return 1e15

    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", trl_lookup)
    cpu, cuda = (SimpleNamespace(device=torch.device(kind)) for kind in ("cpu", "cuda"))
    with peak_flops_unknown_off_cuda():
        assert async_grpo_trainer.get_peak_flops_per_device(cpu, "float32") is None
        assert async_grpo_trainer.get_peak_flops_per_device(cuda, "bfloat16") == 1e15
    assert calls == [("cuda", "bfloat16")]
    assert async_grpo_trainer.get_peak_flops_per_device is trl_lookup

    with pytest.raises(RuntimeError, match="constructor failed"), peak_flops_unknown_off_cuda():
        raise RuntimeError("constructor failed")
    assert async_grpo_trainer.get_peak_flops_per_device is trl_lookup


# ---------------------------------------------------------------------------------------------------------------
# Disk weight transfer


class VLLMStub:
    """Records every request to it; `/collective_rpc` also records the folder's files and loads the weights, as the
    server would at that moment. `status[route]` makes a route answer that status with body "stub failure"."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict, dict | None]] = []
        self.files_at_reload: dict[str, list[str]] = {}
        self.weights_at_reload: dict[str, dict[str, torch.Tensor]] = {}
        self.status: dict[str, int] = {}
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.answer()

            def do_POST(self):
                self.answer()

            def answer(self):
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.calls.append((self.command, url.path, parse_qs(url.query), body))
                status = stub.status.get(url.path, 200)
                if status == 200 and url.path == "/collective_rpc":
                    folder = Path(body["kwargs"]["weights_path"])
                    stub.files_at_reload[str(folder)] = sorted(p.name for p in folder.iterdir())
                    stub.weights_at_reload[str(folder)] = load_file(folder / "model.safetensors")
                payload = b"stub failure" if status != 200 else json.dumps({"success": True}).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def routes(self) -> list[str]:
        return [path for _, path, _, _ in self.calls]


@pytest.fixture
def vllm_stub():
    stub = VLLMStub()
    thread = threading.Thread(target=stub.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.server.shutdown()
        stub.server.server_close()
        thread.join(timeout=10)


def small_qwen3(*, tied: bool) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=tied,
    )  # fmt: skip
    return Qwen3ForCausalLM(config)


def trl_weight_stream(model):
    """What `AsyncGRPOTrainer._streaming_iter` sends for an unwrapped CPU model."""
    return ((name, param.detach()) for name, param in async_grpo_trainer._iter_vllm_named_params(model))


def sync(transfer: DiskReloadTransfer, model) -> None:
    """One `_sync_weight_merged` as the main process runs it."""
    transfer.pause()
    transfer.send_weights(trl_weight_stream(model))
    transfer.resume()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_disk_reload_transfer_syncs_through_vllm_reload(vllm_stub, tmp_path, tied):
    model = small_qwen3(tied=tied)
    assert tied_parameter_names(model) == ({"lm_head.weight": "model.embed_tokens.weight"} if tied else {})
    if tied:
        assert "lm_head.weight" not in dict(trl_weight_stream(model))  # why the transfer adds it
    folder = tmp_path / "weights"
    transfer = DiskReloadTransfer(vllm_stub.url, folder, server_timeout=5)
    transfer.bind(model)
    transfer.init_weight_transfer()

    snapshots = []
    for _ in range(2):
        snapshots.append({name: t.clone() for name, t in model.state_dict().items()})
        sync(transfer, model)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param))

    versions = [str(folder / "v1"), str(folder / "v2")]
    one_sync = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert vllm_stub.routes() == ["/health", *one_sync, *one_sync]
    pause, reload = vllm_stub.calls[1], vllm_stub.calls[2]
    assert (pause[0], pause[2], pause[3]) == ("POST", {"mode": ["keep"]}, None)
    assert reload[3] == {"method": "reload_weights", "kwargs": {"weights_path": versions[0]}, "timeout": 1800.0}
    assert vllm_stub.calls[6][3]["kwargs"] == {"weights_path": versions[1]}
    for version, snapshot in zip(versions, snapshots):
        assert vllm_stub.files_at_reload[version] == ["model.safetensors"]
        written = vllm_stub.weights_at_reload[version]
        assert written.keys() == snapshot.keys()  # the tied case: lm_head.weight included
        for name, tensor in snapshot.items():
            torch.testing.assert_close(written[name], tensor, atol=0, rtol=0)
    assert transfer.prefix_cache_reset is True
    assert sorted(p.name for p in folder.iterdir()) == ["v2"]  # the previous version is dropped

    transfer.destroy()
    assert not folder.exists()


def test_disk_reload_transfer_errors_name_the_server(vllm_stub, tmp_path):
    transfer = DiskReloadTransfer(vllm_stub.url, tmp_path / "weights", server_timeout=5)
    model = small_qwen3(tied=True)
    with pytest.raises(RuntimeError, match=r"bind\(model\)"):
        transfer.send_weights(trl_weight_stream(model))
    transfer.bind(model)
    transfer.init_weight_transfer()

    vllm_stub.status["/collective_rpc"] = 500
    with pytest.raises(RuntimeError, match=rf"{vllm_stub.url}/collective_rpc returned 500: stub failure.*can read"):
        transfer.send_weights(trl_weight_stream(model))
    vllm_stub.status["/pause"] = 404
    with pytest.raises(RuntimeError, match=rf"{vllm_stub.url}/pause returned 404.*VLLM_SERVER_DEV_MODE=1"):
        transfer.pause()
    transfer.destroy()
    assert not (tmp_path / "weights").exists()

    unreachable = f"http://127.0.0.1:{free_port()}"
    gone = DiskReloadTransfer(unreachable, tmp_path / "gone", server_timeout=0)
    with pytest.raises(TimeoutError, match=rf"{unreachable} did not answer /health"):
        gone.init_weight_transfer()
    with pytest.raises(RuntimeError, match=rf"POST {unreachable}/resume failed.*reachable at {unreachable}"):
        gone.resume()
    gone.destroy()
    assert not (tmp_path / "gone").exists()


def test_wait_for_health_stops_at_a_dead_server_process_and_shows_its_log(tmp_path, vllm_stub):
    """The one health wait (weight sync, benchmarks' and tests' servers): a server process that died is reported at
    once with its log, not after the deadline; a live server returns."""
    log = tmp_path / "server.log"
    log.write_text("early output\nValueError: no such model\n")
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)exited with 3\. Read the log\..*server\.log:.*no such model"):
        wait_for_health(f"http://127.0.0.1:{free_port()}", 30, process=dead, log_path=log, hint="Read the log.")
    assert time.monotonic() - started < 5
    wait_for_health(vllm_stub.url, 0)
    assert vllm_stub.routes() == ["/health"]


def test_disk_reload_transfer_refuses_a_shared_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    transfer = DiskReloadTransfer("http://127.0.0.1:1", tmp_path)
    with pytest.raises(ValueError, match=r"config\.json.*a folder of its own"):
        transfer.init_weight_transfer()
    assert (tmp_path / "config.json").exists()
