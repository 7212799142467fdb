"""`trl-mintrl tiny-model OUT_DIR`: the offline tiny model + tokenizer used by tests and CPU demos."""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="trl-mintrl tiny-model", description="Build an offline tiny causal LM.", allow_abbrev=False
    )
    parser.add_argument("out_dir", help="folder to write the model and tokenizer to")
    parser.add_argument("--hidden_size", type=int, default=192, help="multiple of 32 (head_dim is 32)")
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--intermediate_size", type=int, default=576)
    parser.add_argument("--vocab_size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from ..tiny import build_tiny_model

    path = build_tiny_model(
        args.out_dir,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        seed=args.seed,
    )
    print(f"tiny model written to {path}")
