"""Suite files (configs/suites/*.yaml): the task cards, seeds, shared fit arguments, the GPT-1
paper's values, the benchmark score and the leaderboard submission of a `gpt-ft suite` run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from jsonargparse import ArgumentParser

from gpt_ft.adapters.names import inside
from gpt_ft.errors import input_file
from gpt_ft.errors.parsing import parse_error_message, repeated_key, yaml_problem
from gpt_ft.eval.zeroshot import ZeroShot
from gpt_ft.weights.pretrained import load_gpt


@dataclass
class SuiteTask:
    """One task of a suite."""

    card: str
    """Task card path: from the working directory, else from the suite file's folder or one of the
    two above it (a shipped suite names `tasks/...` from the repository's root)."""
    paper: dict[str, float] = field(default_factory=dict)
    """The GPT-1 paper's score (percent) per metric: `accuracy`, or `split/metric` for a task with
    several validation splits (MNLI's `validation_matched/accuracy`)."""
    args: list[str] = field(default_factory=list)
    """`gpt-ft fit` arguments for this task only (after the suite's own)."""
    zero_shot: ZeroShot | None = None
    """How to score the task zero-shot when it is not multiple choice (see gpt_ft/eval/zeroshot.py)."""


@dataclass
class Score:
    """A benchmark's overall score: the mean over its tasks, each task's metrics averaged first."""

    name: str
    tasks: list[str]
    """Task names (the cards' `name`)."""
    paper: float | None = None
    """The GPT-1 paper's value."""


@dataclass
class Submission:
    """Leaderboard files gathered from the tasks' predictions and zipped."""

    archive: str
    """Zip file name, written in the output folder."""
    files: list[str]
    """Every file the leaderboard expects; one missing from the run is named in a warning."""

    def __post_init__(self) -> None:
        inside(self.archive, "submission.archive")


@dataclass
class SuiteSpec:
    """A suite file."""

    name: str
    tasks: list[SuiteTask]
    config: str | None = None
    """The `gpt-ft fit` config every task starts from (e.g. configs/finetune/gpt1.yaml)."""
    args: list[str] = field(default_factory=list)
    """`gpt-ft fit` arguments for every task."""
    seeds: list[int] = field(default_factory=lambda: [0])
    score: Score | None = None
    submission: Submission | None = None
    rows: dict[str, list[str]] | None = None
    """Models compared on every task, size and seed: a name and its `gpt-ft fit` arguments each
    (e.g. `pretrained: [--model.init_from=CKPT]`, `from scratch: [--model.preset=gpt-mini]`); the
    first row's labels saved are read against the second's. None: one row, the suite's arguments."""
    train_sizes: list[int | Literal["all"]] | None = None
    """Learning curves: fine-tune on class-stratified subsets of this many training examples ("all":
    the whole split), drawn per seed and the same for every row (`--data.train_size`)."""
    min_steps: int = 100
    """Optimizer steps a subset's run takes at least: where the fit config's epochs give fewer, its
    epochs are raised to ceil(min_steps / steps per epoch), so that small subsets still train."""


@dataclass
class Run:
    """One fine-tuning run of the suite."""

    task: str
    seed: int
    layers: int | None = None  # transferred layers; None: all
    row: str | None = None  # the suite file's row (model compared); None: the one row
    size: int | None = None  # training examples (a stratified subset); None: the whole split

    @property
    def folder(self) -> str:
        parts = [] if self.row is None else [row_folder(self.row)]
        parts.append(self.task)
        parts += [] if self.layers is None else [f"layers-{self.layers}"]
        parts += [] if self.size is None else [f"size-{self.size}"]
        return "/".join([*parts, f"seed-{self.seed}"])

    def __str__(self) -> str:
        extra = [] if self.row is None else [self.row]
        extra += [] if self.layers is None else [f"{self.layers} layers"]
        extra += [] if self.size is None else [f"{self.size} examples"]
        return f"{self.task} seed {self.seed}" + (f" ({', '.join(extra)})" if extra else "")


def row_folder(name: str) -> str:
    """The folder of a row's runs: its name with spaces and slashes as dashes."""
    return name.replace(" ", "-").replace("/", "-")


def check_paper(source: str, entry: SuiteTask, task):
    """`task` (the card of `entry`), once the paper's values name its metrics (`accuracy`, or
    `split/metric` of a validation split): a misspelt key would be a row of its own. `source`:
    the suite file (or suite) named in the message."""
    named = {*task.metrics, *(f"{split}/{m}" for split in task.validation_splits for m in task.metrics)}
    if unknown := sorted(set(entry.paper) - named):
        raise ValueError(
            f"{source}, task {task.name!r}: paper names {unknown}, not among its metrics ({sorted(named)})."
        )
    return task


def check_files(cards: dict, data_dirs: dict[str | None, str], fine_tune: bool) -> None:
    """The local files the suite's tasks read first, each there before any run starts (a task's
    folder missing was found when its turn came, the earlier tasks trained): the training split's
    where they are fine-tuned, the validation splits' where fine-tuned or scored zero-shot."""
    from gpt_ft.data.layout import split_file
    from gpt_ft.errors import TaskDataError

    for name, (entry, task) in cards.items():
        data_dir = data_dirs.get(name, data_dirs.get(None))
        scored = fine_tune or entry.zero_shot is not None or task.choices_in_examples
        if data_dir is None or task.local is None or not scored:
            continue
        for split in ["train"] * fine_tune + task.validation_splits:
            if split in task.local.splits and not (path := split_file(task, split, data_dir)).is_file():
                raise TaskDataError(
                    f"{path}: file not found (split {split!r} of task {name!r}); no run started."
                )


def check_sweeps(sizes: list[int | None], layers: list[int], init_from: str | None = None) -> None:
    """`--train_sizes` (None: all) and `--transfer_layers`: positive sizes, and each value once (a
    run a seed each: a second would run the first again); depths the weights `init_from` have,
    where they are a local file or folder (a hub id's are found when its first run starts)."""
    if bad := [s for s in sizes if s is not None and s < 1 or sizes.count(s) > 1]:
        said = "all" if bad[0] is None else bad[0]
        raise ValueError(f"--train_sizes {said}: a size is a positive number of examples, or all, each once.")
    if twice := [n for n in layers if layers.count(n) > 1]:
        raise ValueError(f"--transfer_layers names {twice[0]} twice: each depth is one run a seed.")
    if layers and min(layers) < 0:
        raise ValueError(f"--transfer_layers {min(layers)}: a depth is a number of blocks kept, from 0.")
    if layers and init_from and Path(init_from).expanduser().exists():  # (before any run trains)
        if max(layers) > (n := load_gpt(init_from).config.n_layer):
            raise ValueError(
                f"--transfer_layers {max(layers)}: {init_from} has {n} blocks; give depths in [0, {n}]."
            )


def as_list(value) -> list:
    """A list option given as one value (`--data_dir DIR`) or as a list (`--data_dir [A, t=B]`)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def arg_text(value: str | int | float | bool) -> str:
    """A command-line argument a YAML list gave as a number or a boolean (`[--trainer.max_steps, 3]`),
    spelled as the command line spells it."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


SECTIONS = {
    "": SuiteSpec,
    "tasks": SuiteTask,
    "score": Score,
    "submission": Submission,
    "tasks.zero_shot": ZeroShot,
}


def in_suite_words(reason: str) -> str:
    """The parser's words for a key a section of a suite file does not take, or lacks, as the
    file's: `tasks: unknown key 'papr' (it takes card, paper, ...)`, `submission: 'files' is missing.`"""
    from dataclasses import fields

    unknown = re.fullmatch(
        r"(?:Group 'suite' does not accept option|([\w.]+): Option) '([^'.]+)[^']*'.*", reason
    )
    if unknown and (section := unknown[1] or "") in SECTIONS:
        takes = ", ".join(f.name for f in fields(SECTIONS[section]))
        return f"{section + ': ' if section else ''}unknown key {unknown[2]!r} (it takes {takes})."
    lacks = re.fullmatch(
        r"(?:([\w.]+): class_path '\S+': )?the following arguments are required: ([\w.]+)\.", reason
    )
    if lacks:
        return f"{lacks[1] + ': ' if lacks[1] else ''}{lacks[2].removeprefix('suite.')!r} is missing."
    return reason


def load_suite(path: str | Path) -> SuiteSpec:
    """Parse and check a suite file; errors name the file and the field at fault."""
    path = input_file(path, "Suite file", give="the suite's YAML file")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(SuiteSpec, "suite")

    try:
        raw = yaml.safe_load(text := path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"Suite file {path} is not UTF-8 text ({exc.reason}); save it as UTF-8.") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"Suite file {path} is not valid YAML: {yaml_problem(exc)}") from None
    if twice := repeated_key(text):
        raise ValueError(f"Suite file {path}, {twice}.")
    if not isinstance(raw, dict):
        raise ValueError(f"Suite file {path} must hold a mapping with `name` and `tasks`.")
    raw = {key: value for key, value in raw.items() if value is not None}  # `seeds:` left empty: the default
    if isinstance(raw.get("tasks"), list):  # `- tasks/glue/rte.yaml` is short for `- card: ...`
        if bad := next(
            ((n, t) for n, t in enumerate(raw["tasks"], 1) if not isinstance(t, (str, dict))), None
        ):
            raise ValueError(
                f"Suite file {path}, task {bad[0]} ({bad[1]!r}): give a card's path, or a mapping with card."
            )
        raw["tasks"] = [
            {"card": t} if isinstance(t, str) else {k: v for k, v in t.items() if v is not None}
            for t in raw["tasks"]
        ]
    try:
        cfg = parser.parse_object({"suite": raw})
        spec = parser.instantiate_classes(cfg).suite
    except Exception as exc:  # jsonargparse's validation errors
        reason = parse_error_message(str(exc)).replace("--suite.", "", 1)
        raise ValueError(f"Suite file {path}: {in_suite_words(reason)}") from None
    if not spec.tasks:
        raise ValueError(f"Suite file {path} lists no tasks.")
    if any(size != "all" and size < 1 for size in spec.train_sizes or []) or spec.min_steps < 0:
        raise ValueError(f"Suite file {path}: train_sizes must be positive numbers or 'all', min_steps >= 0.")
    if spec.rows is not None and not spec.rows:
        raise ValueError(f"Suite file {path}: rows is empty; name at least one, or leave rows out.")
    folders = [row_folder(name) for name in spec.rows or []]
    if clash := sorted({n for n in spec.rows or [] if folders.count(row_folder(n)) > 1}):
        raise ValueError(f"Suite file {path}: rows {clash} would share a folder; give them names apart.")
    base = path.absolute().parent  # `glue.yaml` from its own folder: its parents are not `.` (a link kept)
    for task in spec.tasks:
        task.card = str(_find(task.card, base, f"{path}: task card"))
    if spec.config:
        spec.config = str(_find(spec.config, base, f"{path}: config"))
    return spec


def _find(name: str, base: Path, what: str) -> Path:
    """A path as given (relative to the working directory), else relative to `base`, its parent or
    the parent's (configs/suites/glue.yaml's `tasks/glue/cola.yaml`: the repository's root)."""
    for candidate in (Path(name).expanduser(), base / name, base.parent / name, base.parent.parent / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{what} {name} does not exist.")


def data_dirs(values: list[str]) -> dict[str | None, str]:
    """`DIR` (every task) and `TASK=DIR` (one task) entries."""
    out: dict[str | None, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        key = name if sep and name and "/" not in name else None
        if key in out:
            what = f"{key}=DIR" if key else "a DIR for every task"
            raise ValueError(f"--data_dir gives {what} twice ({out[key]} and {path if key else value}).")
        out[key] = absolute(path if key else value)
    return out


def absolute(path: str | None) -> str | None:
    """A local file or folder as an absolute path (a result records it, and a rerun from another
    folder reads the same one); anything else (a hub id, a path not there) as given."""
    if path is None or not Path(path).expanduser().exists():
        return path
    return str(Path(path).expanduser().resolve())
