"""The command line layer: `gpt-ft` and its commands."""

from gpt_ft.cli.main import main

__all__ = ["main"]
