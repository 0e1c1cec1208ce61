"""The `gpt-ft` command line."""

from __future__ import annotations

import argparse
import sys

import gpt_ft


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="gpt-ft",
        description="Pretrain a from-scratch GPT (GPT-1, GPT-2) and fine-tune it the way GPT-1 did.",
    )
    parser.add_argument("--version", action="version", version=f"gpt-ft {gpt_ft.__version__}")
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    parser.print_help()
