"""Generated inputs for the error paths: task files, cards and configs broken in the ways users'
are, and the property each must keep.

The property: every input ends in success, or in exit code 2 and one sentence that names the file
(and, where there is one, the line as an editor counts it, header = line 1); never a traceback;
nothing already on disk changed.

`tests/test_generated_inputs.py` runs a bounded number of them in the suite (a fixed seed);
`python -m tests.generated --examples 10000` runs many more, at random, and prints how many were
tried and how many failed, with each failure's input.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

FORMATS = ("csv", "tsv", "json", "jsonl", "parquet")
LABELS = ["negative", "positive"]
COLUMNS = ["idx", "sentence", "label"]
MICRO = "{n_positions: 32, n_embd: 16, n_layer: 1, n_head: 2}"

# ---- cells: texts and label values as users' files hold them ----

words = st.sampled_from(["the cat sat .", "a dog runs", "it is not good", "", " ", "café ☕", "x" * 300])
unicode_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
awkward = st.sampled_from(
    ['say "hi"', 'a "b', "a,b", "a\tb", "a\nb", "a\r\nb", "a\rb", "\x00", "\x1b[31m", "\ufeffa", "'", "\\"]
)
texts = st.one_of(words, unicode_text, awkward, st.just("long " * 3000))
good_labels = st.sampled_from([*LABELS, "0", "1", 0, 1])
bad_labels = st.one_of(
    st.sampled_from(["maybe", "2", "-1", "1.0", " positive", "Positive", "nan", "inf", "1e400", "", "null"]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    texts,
)
labels = st.one_of(good_labels, good_labels, bad_labels)


@dataclass
class TaskFile:
    """A task file as the generator drew it: its format, header and rows, and what was done to it."""

    fmt: str
    header: list[str]
    rows: list[list[Any]]
    damage: list[str] = field(default_factory=list)
    """Byte-level changes applied after writing (shown when a case fails)."""
    raw: bytes | None = None
    """The file's bytes when they were drawn directly (empty, random, a truncated parquet)."""

    @property
    def suffix(self) -> str:
        return "." + self.fmt

    def to_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return encode_rows(self.fmt, self.header, self.rows)


def _csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def encode_rows(fmt: str, header: list[str], rows: list[list[Any]], *, newline: str = "\n") -> bytes:
    """The rows written as `fmt` the way common tools write them (ragged rows kept ragged)."""
    if fmt in ("csv", "tsv"):
        cell = _csv_cell if fmt == "csv" else (lambda v: "" if v is None else str(v))
        sep = "," if fmt == "csv" else "\t"
        lines = [sep.join(cell(v) for v in row) for row in [header, *rows]]
        return (newline.join(lines) + newline).encode("utf-8")
    records = [dict(zip(header, row)) for row in rows]
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + newline for r in records).encode("utf-8")
    if fmt == "json":
        return json.dumps(records, ensure_ascii=False, indent=1).encode("utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {}
    for i, name in enumerate(dict.fromkeys(header)):
        values = [row[i] if i < len(row) else None for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowException, OverflowError):  # mixed kinds in one column: as text
            columns[name] = pa.array([None if v is None else str(v) for v in values])
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


@st.composite
def task_files(draw) -> TaskFile:
    """A task file in any of the formats, as often broken as not."""
    fmt = draw(st.sampled_from(FORMATS))
    header = list(COLUMNS)
    how = draw(st.sampled_from(["as is", "as is", "drop", "extra", "rename", "repeat", "reorder"]))
    if how == "drop":
        header.pop(draw(st.integers(0, len(header) - 1)))
    elif how == "extra":
        header.insert(draw(st.integers(0, len(header))), draw(st.sampled_from(["extra", "", "Label"])))
    elif how == "rename":
        header[draw(st.integers(0, len(header) - 1))] = draw(st.sampled_from(["text", "Sentence", "y"]))
    elif how == "repeat":
        header.append(draw(st.sampled_from(header)))
    elif how == "reorder":
        header = draw(st.permutations(header))
    n = draw(st.integers(0, 6))
    rows = []
    for i in range(n):
        row = [i if name == "idx" else draw(labels) if "abel" in name else draw(texts) for name in header]
        ragged = draw(st.sampled_from(["no"] * 8 + ["short", "long"]))
        if ragged == "short" and row:
            row = row[: draw(st.integers(0, len(row) - 1))]
        elif ragged == "long":
            row = [*row, draw(texts)]
        rows.append(row)
    task_file = TaskFile(fmt, header, rows, damage=[how])
    kind = draw(st.sampled_from(["rows"] * 6 + ["empty", "bytes", "damaged"]))
    if kind == "empty":
        task_file.raw = b""
    elif kind == "bytes":
        task_file.raw = draw(st.binary(max_size=64))
    elif kind == "damaged":
        data = task_file.to_bytes()
        changes = ["bom", "utf-16", "latin-1", "truncate", "crlf", "nul", "quote", "blank"]
        change = draw(st.sampled_from(changes))
        if change == "bom":
            data = b"\xef\xbb\xbf" + data
        elif change == "utf-16":  # (a parquet file's bytes: garbled, as any binary file re-encoded)
            data = data.decode("utf-8", errors="replace").encode("utf-16")
        elif change == "latin-1":
            data = data.decode("utf-8", errors="replace").encode("latin-1", errors="replace") + b"\xe9"
        elif change == "truncate":
            data = data[: draw(st.integers(0, max(len(data) - 1, 0)))]
        elif change == "crlf":
            data = data.replace(b"\n", b"\r\n")
        elif change in ("nul", "quote", "blank"):
            at = draw(st.integers(0, len(data)))
            data = data[:at] + {"nul": b"\x00", "quote": b'"', "blank": b"\n\n"}[change] + data[at:]
        task_file.raw, task_file.damage = data, [*task_file.damage, change]
    return task_file


# ---- preference pairs (reward models): JSON lines, gzipped or not ----

MARKER = "\n\nAssistant:"
replies = st.one_of(
    texts,
    texts.map(lambda t: f"\n\nHuman: hi{MARKER} {t}"),
    st.none(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [[{"role": "user", "content": "hi"}], [{"role": "user"}], {"content": "x"}, ["a", 1], []]
    ),
)
margins = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0.5", "wide", "", "1e400", 2]),
)


@dataclass
class PreferenceFile:
    """Preference pairs as drawn: the rows (fields may be missing), the card's way of finding the
    prompt, and the changes made to the bytes."""

    rows: list[dict[str, Any]]
    card: dict[str, Any]
    gzipped: bool
    damage: list[str] = field(default_factory=list)
    raw: bytes | None = None

    @property
    def name(self) -> str:
        return "train.jsonl.gz" if self.gzipped else "train.jsonl"

    def to_bytes(self) -> bytes:
        import gzip

        data = self.raw
        if data is None:
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.rows).encode("utf-8")
        return gzip.compress(data, mtime=0) if self.gzipped else data


@st.composite
def preference_files(draw) -> PreferenceFile:
    """A file of preference pairs, as often broken as not, and a card that reads it."""
    row = st.fixed_dictionaries(
        {"prompt": texts, "chosen": replies, "rejected": replies},
        optional={"margin": margins, "extra": texts},
    )
    rows = draw(st.lists(row, min_size=0, max_size=5))
    for r in rows:
        if draw(st.sampled_from([False] * 6 + [True])):
            r.pop(draw(st.sampled_from(["prompt", "chosen", "rejected"])))
    card = draw(
        st.sampled_from(
            [{"prompt": "prompt"}, {"turn_marker": MARKER}, {"prompt": "prompt", "margin": "margin"}, {}]
        )
    )
    case = PreferenceFile(rows, card, gzipped=draw(st.booleans()))
    change = draw(st.sampled_from(["none"] * 5 + ["truncate", "garbage line", "not gzip", "empty"]))
    if change != "none":
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        if change == "truncate":
            data = data[: draw(st.integers(0, max(len(data) - 1, 0)))]
        elif change == "garbage line":
            lines = data.split(b"\n")
            lines.insert(
                draw(st.integers(0, len(lines))), draw(st.sampled_from([b"{", b"[1]", b"null", b"x"]))
            )
            data = b"\n".join(lines)
        elif change == "empty":
            data = b""
        case.raw, case.damage = data, [change]
        if change == "not gzip":  # a plain file named .gz
            case.raw, case.gzipped = data, False
            case.damage = ["not gzip: named .gz"]
    return case


def check_preference_file(root: Path, tokenizer: str, case: PreferenceFile) -> str | None:
    """A drawn preference file through the data module and `gpt-ft explain`: the property."""
    name = "train.jsonl.gz" if case.gzipped or case.damage == ["not gzip: named .gz"] else case.name
    args = {"name": "prefs", **case.card, "local": {"splits": {"train": f"d/{name}"}}}
    card = {"class_path": "gpt_ft.adapters.Preference", "init_args": args}
    return check_file(root, tokenizer, name, case.to_bytes(), yaml.safe_dump(card))


def card_text(file_name: str, **init_args: Any) -> str:
    args = {"name": "sent", "labels": LABELS, "local": {"splits": {"train": f"d/{file_name}"}}, **init_args}
    return yaml.safe_dump({"class_path": "gpt_ft.adapters.SingleText", "init_args": args})


# ---- one bad label at a known line ----


@dataclass
class OneBadRow:
    """A file of good rows but one, whose label is not among the labels; `where` is what an error
    must name: its line as an editor counts them, or its record in a file without lines."""

    fmt: str
    data: bytes
    where: str


@st.composite
def one_bad_row(draw) -> OneBadRow:
    fmt = draw(st.sampled_from(FORMATS))
    n = draw(st.integers(1, 8))
    bad = draw(st.integers(0, n - 1))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    blank = draw(st.sets(st.integers(0, n), max_size=3)) if fmt != "json" else set()
    multiline = fmt == "csv" and draw(st.booleans())
    line = 1  # the header's (csv, tsv), or the array's opening bracket (json)
    where = ""
    rows = []
    for i in range(n):
        choices = ["a cat", "two\ndogs", "x, y", 'a "quote"'] if multiline else ["a cat", "b"]
        text = draw(st.sampled_from(choices))
        rows.append([i, text, "maybe" if i == bad else draw(st.sampled_from(LABELS))])
    if fmt in ("csv", "tsv"):
        header_and_rows = encode_rows(fmt, COLUMNS, rows, newline="\n").decode().split("\n")
        # Records: the csv writer quoted the texts with newlines; split back by record.
        records = _records(header_and_rows, fmt)
        out = [records[0]]
        for i, record in enumerate(records[1:]):
            if i in blank:
                out.append("")
                line += 1
            line += 1
            if i == bad:
                where = f"line {line}"
            out.append(record)
            line += record.count("\n")
        data = ("\n".join(out) + "\n").replace("\n", newline).encode()
    elif fmt == "jsonl":
        out = []
        for i, row in enumerate(rows):
            if i in blank:
                out.append("")
            out.append(json.dumps(dict(zip(COLUMNS, row))))
            if i == bad:
                where = f"line {len(out)}"
        data = (newline.join(out) + newline).encode()
    elif fmt == "json":  # one record a line inside the array, as json.dump(indent=None) per record writes it
        out = ["["]
        for i, row in enumerate(rows):
            out.append(json.dumps(dict(zip(COLUMNS, row))) + ("," if i < n - 1 else ""))
            if i == bad:
                where = f"line {len(out)}"
        out.append("]")
        data = newline.join(out).encode()
    else:
        data, where = encode_rows("parquet", COLUMNS, rows), f"record {bad + 1}"
    if fmt != "parquet" and draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return OneBadRow(fmt, data, where)


def _records(lines: list[str], fmt: str) -> list[str]:
    """Lines joined back into csv records (a quoted cell may hold newlines)."""
    records, pending = [], ""
    for text in lines[:-1]:
        pending = f"{pending}\n{text}" if pending else text
        if fmt == "tsv" or pending.count('"') % 2 == 0:
            records.append(pending)
            pending = ""
    return records


# ---- cards and configs ----

ADAPTERS = [
    "gpt_ft.adapters.SingleText",
    "gpt_ft.adapters.TextPair",
    "gpt_ft.adapters.MultipleChoice",
    "gpt_ft.adapters.FillIn",
    "gpt_ft.adapters.CauseEffect",
    "gpt_ft.adapters.Preference",
    "gpt_ft.adapters.Embedding",
    "gpt_ft.adapters.Reranker",
    "gpt_ft.adapters.NliTriplets",
    "gpt_ft.adapters.Nope",
    "os.path",
    "x",
]
any_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.sampled_from(["a", "b", "a", 1]), max_size=3),
    st.dictionaries(
        st.sampled_from(["a", "train", "x"]), st.sampled_from(["a", "d/train.tsv", 1]), max_size=2
    ),
)


@st.composite
def cards(draw) -> str:
    """A card's YAML: right, wrong in one or more fields, of another shape, or not YAML at all."""
    args: dict[str, Any] = {
        "name": "sent",
        "labels": list(LABELS),
        "local": {"splits": {"train": "d/train.tsv"}},
    }
    fields = {
        "labels": st.one_of(
            st.just(["a", "a"]), st.just([]), st.lists(st.text(max_size=3), max_size=4), any_value
        ),
        "metrics": st.one_of(
            st.lists(st.sampled_from(["accuracy", "f1", "matthews", "pearson", "bleu"]), max_size=3),
            any_value,
        ),
        "main_metric": st.one_of(st.sampled_from(["accuracy", "f1", "pearson", "nope"]), any_value),
        "regression": st.one_of(st.booleans(), any_value),
        "score_range": st.one_of(st.just([5, 0]), st.just([0, 5]), any_value),
        "ignore_labels": any_value,
        "label": st.one_of(st.sampled_from(["label", "nope", ""]), any_value),
        "text": st.one_of(st.sampled_from(["sentence", "nope"]), any_value),
        "submission_labels": st.one_of(st.just(["0"]), st.just(["0", "1"]), any_value),
        "submission_files": any_value,
        "validation_splits": st.one_of(st.just(["train"]), st.just(["dev"]), any_value),
        "local": st.one_of(
            st.just({"splits": {"train": "d/nope.tsv"}}),
            st.just({"splits": {"train": "d/train.tsv[5:]"}}),
            st.just({"splits": {"train": "d/train.tsv"}, "format": "xml"}),
            any_value,
        ),
        "unknown_field": any_value,
        "name": any_value,
        # a preference card's own (on another shape's card: unknown fields)
        "turn_marker": st.one_of(st.sampled_from(["\n\nAssistant:", ""]), any_value),
        "prompt": st.one_of(st.sampled_from(["sentence", "nope"]), any_value),
        "chosen": st.one_of(st.sampled_from(["sentence", "nope"]), any_value),
        "center_rewards": st.one_of(st.sampled_from([0.01, -1.0]), any_value),
        "margin": st.one_of(st.sampled_from(["label", "nope"]), any_value),
        # an embedding's or a reranker's own
        "anchor": st.one_of(st.sampled_from(["sentence", "nope"]), any_value),
        "positive": st.one_of(st.sampled_from(["sentence", "label"]), any_value),
        "query": st.one_of(st.sampled_from(["sentence", "nope"]), any_value),
        "negatives": st.one_of(st.sampled_from(["label", "nope", ["sentence", "label"]]), any_value),
        "num_negatives": st.one_of(st.sampled_from([0, 1, 3]), any_value),
        "score": st.one_of(st.sampled_from(["label", "sentence"]), any_value),
        "loss": st.one_of(st.sampled_from(["cosent", "infonce", "triplet"]), any_value),
        "temperature": st.one_of(st.sampled_from([0.05, 0.0, -1.0]), any_value),
        "dimensions": st.one_of(st.sampled_from([0, 8]), any_value),
        # multiple choice's own, and its fill-in and cause-effect kinds'
        "context": st.one_of(st.sampled_from([["sentence"], "sentence", ["sentence.x"], []]), any_value),
        "choices": st.one_of(
            st.sampled_from(["sentence", ["sentence", "label"], "sentence.text"]), any_value
        ),
        "num_choices": st.one_of(st.sampled_from([0, 2, 5]), any_value),
        "choice_names": st.one_of(st.sampled_from(["label", "sentence", "choices.label"]), any_value),
        "sentence": st.one_of(st.sampled_from(["sentence", "nope"]), any_value),
        "options": st.one_of(st.sampled_from([["sentence", "label"], "sentence"]), any_value),
        "blank": st.one_of(st.sampled_from(["_", "", "a"]), any_value),
        "question": st.one_of(st.sampled_from(["label", "nope"]), any_value),
        "connectives": st.one_of(st.just({"a": "because"}), any_value),
    }
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)):
        args[name] = draw(fields[name])
    for name in draw(st.lists(st.sampled_from(["labels", "name", "local"]), max_size=1)):
        args.pop(name, None)
    card = {"class_path": draw(st.sampled_from(ADAPTERS[:1] * 4 + ADAPTERS[1:])), "init_args": args}
    text = yaml.safe_dump(card, allow_unicode=True)
    cut = draw(st.sampled_from(["none"] * 6 + ["truncate", "tab", "not a mapping"]))
    if cut == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif cut == "tab":
        text = text.replace("  ", "\t", 1)
    elif cut == "not a mapping":
        text = draw(st.sampled_from(["- a\n- b\n", "just text\n", "42\n", "{a: [\n"]))
    return text


@st.composite
def configs(draw) -> dict[str, Any]:
    """A fit config's sections with a few values of the wrong kind or out of range."""
    config: dict[str, Any] = {
        "model": {"preset": "gpt-micro", "overrides": MICRO},
        "data": {"batch_size": 2, "max_length": 32},
        "trainer": {"max_epochs": 1},
    }
    values = {
        ("model", "lr"): st.one_of(st.sampled_from([0, -1, 1e-3, "fast"]), any_value),
        ("model", "lm_coef"): st.sampled_from([-0.5, 0.5, "half", None]),
        ("model", "preset"): st.sampled_from(["gpt9", "gpt-micro", "", None, 3]),
        ("model", "overrides"): st.sampled_from(["{n_embd: 7}", "{nope: 1}", "{n_head: 0}", "[1]", 5, None]),
        ("model", "weight_decay"): st.sampled_from([-1, 0.01, "x", float("nan")]),
        ("model", "warmup"): any_value,
        ("data", "batch_size"): st.one_of(st.sampled_from([0, -2, 2, 10**9, "two"]), any_value),
        ("data", "max_length"): st.sampled_from([0, 3, 4, 33, 10**6, "long", None]),
        ("data", "data_dir"): st.sampled_from(["nowhere", "", None]),
        ("trainer", "max_epochs"): st.sampled_from([-2, 0, 1, "x", 1.5]),
        ("trainer", "precision"): st.sampled_from(["32-true", "bf16-mixed", "16-true", "fp7", 64]),
        ("trainer", "accumulate_grad_batches"): st.sampled_from([0, -1, 2, "x"]),
        ("trainer", "gradient_clip_val"): st.sampled_from([-1.0, 1.0, "x"]),
        ("trainer", "nonsense"): any_value,
        ("trainer", "limit_train_batches"): st.sampled_from([-1, 0, 1, 1.5, "x"]),
        ("trainer", "val_check_interval"): st.sampled_from([0, -1, 0.5, 2.0, 10**6]),
        ("trainer", "log_every_n_steps"): st.sampled_from([-1, 0, 1]),
        ("trainer", "max_steps"): st.sampled_from([-5, -1, 0, 1]),
        # (a count above 1 would start processes of this one's command line: DDP on the CPU)
        ("trainer", "devices"): st.sampled_from([0, 1, -1, "auto", "x", -2, "0,1", [0]]),
        ("trainer", "accelerator"): st.sampled_from(["cpu", "tpu", "gpu", "nope"]),
        ("seed_everything", None): st.sampled_from([-1, 2**40, "x", None]),
        ("unknown_section", None): any_value,
    }
    for section, name in draw(st.lists(st.sampled_from(sorted(values, key=str)), max_size=2, unique=True)):
        value = draw(values[(section, name)])
        if name is None:
            config[section] = value
        else:
            config[section][name] = value
    return config


# ---- running one input, and what must hold ----


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`gpt-ft ARGV` in this process: exit code, stdout and stderr; an exception that escapes
    `main` comes back as code -1 with its traceback as stderr."""
    from gpt_ft.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (the property: nothing else escapes)
        return -1, out.getvalue(), traceback.format_exc()
    return code, out.getvalue(), err.getvalue()


def sentence_problem(code: int, err: str, *, names: str | None) -> str | None:
    """What is wrong with how a command ended (None: nothing): exit 0, or exit 2 with one line
    `gpt-ft: error: ...` naming `names`, and no traceback."""
    if code == 0:
        return None
    if code != 2:
        return f"exit code {code}:\n{err[-3000:]}"
    if "Traceback" in err:
        return f"a traceback:\n{err[-3000:]}"
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if not last.startswith("gpt-ft: error: ") or not last.rstrip().endswith((".", ".'", '."', ".)")):
        return f"not one sentence: {last!r}"
    if names is not None and names not in last:
        return f"the sentence does not name {names}: {last!r}"
    return None


def editor_lines(data: bytes) -> int:
    """Lines of a file as an editor counts them (\\n, \\r\\n and \\r each end one)."""
    text = data.decode("utf-8", errors="replace")
    return max(len(text.replace("\r\n", "\n").replace("\r", "\n").split("\n")), 1)


def check_task_file(root: Path, tokenizer: str, task_file: TaskFile) -> str | None:
    """A drawn task file through the data module and through `gpt-ft explain`: the property."""
    name = "train" + task_file.suffix
    return check_file(root, tokenizer, name, task_file.to_bytes(), card_text(name))


def check_file(root: Path, tokenizer: str, name: str, data: bytes, card_yaml: str) -> str | None:
    """A task file `d/NAME` holding `data`, read by the card, through the data module and through
    `gpt-ft explain`: the property."""
    from gpt_ft.adapters import TaskDataError
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule

    path = root / "d" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    card = root / "card.yaml"
    card.write_text(card_yaml)
    before = snapshot(root)
    if name.endswith(".gz") and data[:2] == b"\x1f\x8b":  # lines are counted in the text
        import gzip
        import zlib

        with contextlib.suppress(OSError, EOFError, zlib.error):
            data = gzip.decompress(data)
    problem = None
    try:
        module = TaskDataModule(load_card(card), tokenizer, data_dir=str(root), max_length=32)
        module.encoded("train", labelled=True)
    except TaskDataError as exc:
        message = str(exc)
        if not message.startswith(str(path)) or "\n" in message or not message.endswith("."):
            problem = f"data module: not one sentence naming {path}: {message!r}"
        elif ", line " in message:
            line = int(message.split(", line ", 1)[1].split(":")[0].split(",")[0])
            if not 1 <= line <= editor_lines(data):
                problem = f"data module: line {line} of a {editor_lines(data)}-line file: {message!r}"
    except Exception:  # noqa: BLE001
        problem = f"data module: {traceback.format_exc()}"
    if problem is None:
        code, _, err = run_cli(
            ["explain", f"--data.task={card}", f"--data.tokenizer={tokenizer}", f"--data.data_dir={root}"]
        )
        problem = sentence_problem(code, err, names=None if code == 0 or "--index" in err else str(path))
    if problem is None and snapshot(root) != before:
        problem = "files on disk changed"
    return problem


def check_one_bad_row(root: Path, tokenizer: str, case: OneBadRow) -> str | None:
    """The error names exactly the line (or record) of the one bad row, and the field."""
    name = "train." + case.fmt
    path = root / "d" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(case.data)
    card = root / "card.yaml"
    card.write_text(card_text(name))
    code, _, err = run_cli(
        ["explain", f"--data.task={card}", f"--data.tokenizer={tokenizer}", f"--data.data_dir={root}"]
    )
    expected = f"gpt-ft: error: {path}, {case.where}: label 'maybe' in field 'label' is not among the labels"
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if code != 2 or not last.startswith(expected):
        return f"expected {expected!r}..., exit 2; got exit {code}: {last!r}"
    return None


def check_card(root: Path, tokenizer: str, text: str) -> str | None:
    """A drawn card through `gpt-ft explain`, over a good data file."""
    path = root / "d" / "train.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("idx\tsentence\tlabel\n0\tthe cat sat .\tpositive\n1\ta dog\tnegative\n")
    card = root / "card.yaml"
    card.write_text(text, encoding="utf-8")
    before = snapshot(root)
    code, _, err = run_cli(
        ["explain", f"--data.task={card}", f"--data.tokenizer={tokenizer}", f"--data.data_dir={root}"]
    )
    problem = sentence_problem(code, err, names=str(root))  # the card, or the file it points to
    if problem is None and snapshot(root) != before:
        problem = "files on disk changed"
    return problem


def check_config(root: Path, tokenizer: str, config: dict[str, Any]) -> str | None:
    """A drawn fit config through `gpt-ft fit` (one step of a micro model when it is right)."""
    path = root / "d" / "train.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("idx\tsentence\tlabel\n0\tthe cat sat .\tpositive\n1\ta dog\tnegative\n")
    (root / "card.yaml").write_text(card_text("train.tsv", validation_splits=["train"]))
    data = config["data"] if isinstance(config.get("data"), dict) else {}
    data.update({"task": str(root / "card.yaml"), "tokenizer": tokenizer})
    data.setdefault("data_dir", str(root))
    if data.get("data_dir") in ("nowhere", ""):
        data["data_dir"] = str(root / "nowhere")
    config = {**config, "data": data}
    file = root / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    before = snapshot(root)
    code, _, err = run_cli(
        [
            "fit",
            f"--config={file}",
            "--trainer.fast_dev_run=1",
            f"--trainer.default_root_dir={root / 'runs'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    problem = sentence_problem(code, err, names=None)
    after = snapshot(root)
    changed = [name for name, data in before.items() if after.get(name) != data]
    if problem is None and changed:
        problem = f"files on disk changed: {changed}"
    if problem is None and code == 2 and any(name.endswith(".ckpt") for name in after):
        problem = "a refused run wrote a checkpoint"
    return problem


CHECKS = {
    "task files": (task_files(), check_task_file),
    "one bad row": (one_bad_row(), check_one_bad_row),
    "preference files": (preference_files(), check_preference_file),
    "cards": (cards(), check_card),
    "configs": (configs(), check_config),
}


def quiet() -> None:
    """No progress bars or info logs from datasets and Lightning: a case's output is its result."""
    import logging

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_many(name: str, tokenizer: str, examples: int, *, seed: int | None = None) -> tuple[int, list[str]]:
    """Draw `examples` inputs of one kind and check each: (how many tried, the failures)."""
    strategy, check = CHECKS[name]
    tried, failures = 0, []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: keep counting
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(value) -> None:
        nonlocal tried
        tried += 1
        with tempfile.TemporaryDirectory() as tmp:
            problem = check(Path(tmp), tokenizer, value)
        if problem is not None:
            failures.append(f"{name}: {value!r}\n  {problem}")
            print(f"\n{failures[-1]}\n", flush=True)

    if seed is not None:
        one = __import__("hypothesis").seed(seed)(one)
    one()
    return tried, failures


def tiny_tokenizer(root: Path) -> str:
    from gpt_ft.data.tokenizer import train_tokenizer

    corpus = root / "corpus.txt"
    corpus.write_text("the cat sat on the mat . a dog runs in a park . it is not good .\n" * 40)
    train_tokenizer(inputs=[corpus], vocab_size=300, out_dir=root / "tok", show_progress=False)
    return str(root / "tok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="inputs in all, shared among the kinds")
    parser.add_argument("--kinds", nargs="+", choices=sorted(CHECKS), default=sorted(CHECKS))
    parser.add_argument("--seed", type=int, default=None, help="default: a new draw each run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # The datasets cache of thousands of one-off files goes with the run.
        os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / "datasets")
        return _run(args)


def _run(args) -> int:
    quiet()
    # Fit runs of the configs cost about a second each, the others a few hundredths: configs get a
    # twentieth of the inputs.
    weights = {name: (1 if name == "configs" else 6) for name in args.kinds}
    total, failures = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = tiny_tokenizer(Path(tmp))
        for name in args.kinds:
            n = max(1, round(args.examples * weights[name] / sum(weights.values())))
            start = time.perf_counter()
            tried, failed = run_many(name, tokenizer, n, seed=args.seed)
            total += tried
            failures += failed
            took = time.perf_counter() - start
            print(f"{name}: {tried} tried, {len(failed)} failed ({took:.0f} s)", flush=True)
    for failure in failures:
        print("\n" + failure)
    print(f"\n{total} generated inputs tried, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
