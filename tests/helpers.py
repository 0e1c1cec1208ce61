"""Helpers shared by the tests: a micro model's shape, data files, the arguments of a quick run."""

from __future__ import annotations

import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MICRO = "{n_positions: 64, n_embd: 32, n_layer: 1, n_head: 2}"


def write_rows(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    delimiter = "\t" if path.suffix == ".tsv" else ","
    with path.open("w", newline="") as f:
        writer = csv.writer(
            f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
        )
        writer.writerow(header)
        writer.writerows(rows)


def common_args(card: Path, tokenizer_dir: str, root: Path) -> list[str]:
    return [
        f"--data.task={card}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={root}",
        "--data.batch_size=4",
        "--data.max_length=64",
        "--model.preset=gpt-micro",
        f"--model.overrides={MICRO}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
