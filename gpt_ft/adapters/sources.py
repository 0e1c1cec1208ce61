"""Where a task's examples come from: a hub dataset, local files, and which splits are evaluated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpt_ft.errors import CardError


@dataclass
class HubDataset:
    """A dataset on the Hugging Face Hub, loaded with `datasets.load_dataset(path, name)`."""

    path: str
    """Dataset id, e.g. nyu-mll/glue."""
    name: str | None = None
    """Configuration (subset) name, e.g. rte."""
    columns: dict[str, str] | None = None
    """Renames: dataset column -> the field name the adapter reads."""
    splits: dict[str, str] | None = None
    """Our split name -> the dataset's split (slices such as 'train[:90%]' allowed); default: same names."""
    configs: dict[str, str] | None = None
    """Our split name -> the configuration it comes from when not `name` (GLUE's diagnostic set: ax)."""
    data_dir: str | None = None
    """The folder of the dataset's repository to load (Anthropic/hh-rlhf: a subset, e.g. helpful-base)."""


@dataclass
class LocalFiles:
    """A task's files under `--data.data_dir`, and how to read them."""

    splits: dict[str, str]
    """Split name -> file path relative to data_dir; a slice may follow, e.g. 'val.csv[:1497]'."""
    format: Literal["tsv", "csv", "json", "parquet"] | None = None
    """File format; by default from the extension (.tsv, .csv, .json/.jsonl, .parquet)."""
    column_names: list[str] | None = None
    """Column names of files without a header row (e.g. GLUE's CoLA train/dev)."""
    headerless_splits: list[str] | None = None
    """Splits whose files have no header row (they use column_names); default: every split if column_names."""
    columns: dict[str, str] | None = None
    """Renames: file column -> the field name the adapter reads."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.headerless_splits or []) - set(self.splits))
        if unknown:
            raise CardError(
                f"local.headerless_splits names {unknown}, which local.splits does not: "
                f"it has {sorted(self.splits)}."
            )
        if self.headerless_splits and not self.column_names:
            raise CardError(
                "local.headerless_splits needs local.column_names: the names of those files' columns."
            )


@dataclass
class Sources:
    """What a card says about its data: where it lives, the splits evaluated, the examples' ids."""

    hub: HubDataset | None = None
    local: LocalFiles | None = None
    validation_splits: list[str] = field(default_factory=lambda: ["validation"])
    test_splits: list[str] = field(default_factory=lambda: ["test"])
    index: str | None = "idx"
