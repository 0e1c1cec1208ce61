"""Temperature scaling (Guo et al. 2017): one number T that divides a classifier's logits, fitted
on a validation split to minimise the negative log-likelihood. The likeliest class stays the
same; the probabilities come closer to how often the model is right.

    gpt-ft calibrate --ckpt_path runs/.../best.ckpt --output runs/.../calibrated.ckpt

The calibrated checkpoint carries T (`temperature`), and `Classifier`, `gpt-ft label`, evaluation
and `export` (the score layer divided by T) use it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt_ft.adapters import ClassificationHead, TaskDataError
from gpt_ft.adapters.sources import label_spelling
from gpt_ft.data.files import absent_columns, located_split
from gpt_ft.errors import check_output_file, real_path, writing
from gpt_ft.eval.classifier import Classifier
from gpt_ft.eval.labelling import hidden_beside, put_in_place
from gpt_ft.weights.checkpoint import Checkpoint


def fit_temperature(outputs: Tensor, labels: Tensor, losses) -> float:
    """The T > 0 that minimises the mean of `losses(outputs / T, labels)` (L-BFGS on log T)."""
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    outputs = outputs.double()
    # Tolerances at float64's resolution: a small logit gap changes the loss by less than the defaults.
    optimizer = torch.optim.LBFGS(
        [log_t],
        lr=0.1,
        max_iter=200,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = losses(outputs / log_t.exp(), labels).mean()
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


def separated(logits: Tensor, labels: Tensor) -> bool:
    """Whether no example has a logit above its right class's (or choice's): then each one's
    softmax loss at T only falls as T falls (a tie's toward log k), and no T > 0 is the best."""
    right = logits.gather(-1, labels[:, None])
    return bool((logits.scatter(-1, labels[:, None], -math.inf) <= right).all())


def no_better_than_uniform(logits: Tensor, labels: Tensor, losses, temperature: float) -> bool:
    """Whether the loss at `temperature` is no lower, to 1e-6 nats, than with every answer equally
    likely (a choice the row lacks, `ChoiceHead`'s floor, left out): a model no better than chance,
    whose loss, convex in 1/T and not falling from 1/T = 0, is least as T grows without end."""
    valid = logits != torch.finfo(logits.dtype).min
    uniform = valid.sum(-1).double().log().mean()
    return bool(losses(logits.double() / temperature, labels).mean() >= uniform - 1e-6)


def split_outputs(
    clf: Classifier,
    rows: list[dict[str, Any]],
    *,
    batch_size: int = 32,
    name: str = "The calibration split",
    where: Callable[[int], str] | None = None,
) -> tuple[Tensor, Tensor]:
    """The head's outputs (temperature 1) and the labels of labelled `rows` (those whose label the
    card ignores left out, as the data module leaves them out of the split `validate` scores).
    A bad label is named by `where(row)` ('FILE, line N'); `name` is the split's, in messages."""
    ignored = set(clf.task.ignore_labels or [])  # spelt as the data module reads them (2.0: '2')
    rows = [(i, row) for i, row in enumerate(rows) if label_spelling(row.get(clf.task.label)) not in ignored]
    labels = []
    for i, row in rows:
        try:
            labels.append(clf.task.output.example_label(row))
        except TaskDataError as exc:
            raise TaskDataError(f"{where(i)}: {exc}" if where else str(exc)) from None
    kept = [k for k, label in enumerate(labels) if label is not None]
    if not kept:
        raise TaskDataError(f"{name} holds no labelled examples.")
    rows, labels = [rows[k] for k in kept], [labels[k] for k in kept]
    outputs = clf.raw_outputs([row for _, row in rows], batch_size=batch_size).clone()  # (fitted on)
    absent = outputs == torch.finfo(outputs.dtype).min  # a choice the row lacks (`ChoiceHead`'s floor)
    broken = ~(outputs.isfinite() | absent).all(-1)
    if broken.any():  # a NaN T, written into the checkpoint, would make every probability NaN
        first = rows[int(broken.nonzero()[0])][0]
        first = where(first) if where else f"row {first + 1}"
        raise ValueError(
            f"{name} fits no temperature: the model's outputs are not finite (NaN or infinite) on "
            f"{int(broken.sum())} of its {len(rows)} examples (the first: {first}); its weights are "
            "broken: train it again."
        )
    return outputs, torch.tensor(labels)


def calibrate(
    *,
    ckpt_path: str,
    output: str,
    split: str | None = None,
    data_dir: str | None = None,
    overwrite: bool = False,
) -> dict[str, float]:
    """Fit a classifier's temperature on a validation split and write it into a new checkpoint.

    `gpt-ft calibrate`; returns T and the split's expected calibration error before (at the
    checkpoint's own temperature: 1, or one an earlier calibration fitted) and after.

    Args:
        ckpt_path: A fine-tuned checkpoint of gpt-ft fit.
        output: The calibrated checkpoint (a new file).
        split: Default: the card's first validation split.
        data_dir: Default: the one the checkpoint was trained on.
        overwrite: Replace --output if it exists.
    """
    ckpt = ckpt_path
    stored = Checkpoint.read(ckpt)  # (first: a path that cannot be followed, a loop, said as read)
    output = check_output_file(output, "--output", overwrite=overwrite, reads=Path(ckpt).expanduser())
    beside = output.parent.resolve() != Path(ckpt).expanduser().resolve().parent
    tokenizer = real_path(output).parent / f"{output.stem}.tokenizer" if beside else None  # it goes along
    if tokenizer is not None and tokenizer.exists() and not (overwrite and tokenizer.is_dir()):
        replace = ", or --overwrite true to replace it" if tokenizer.is_dir() else ""
        raise ValueError(
            f"{tokenizer}, where --output's tokenizer goes, exists: give another --output{replace}."
        )
    clf = Classifier.from_checkpoint(stored, device="cpu")
    task = clf.task
    if not task.output.has_probabilities:
        raise ValueError(
            f"Task {task.name!r} has no softmax over labels to calibrate: `gpt-ft calibrate` fits "
            "classifiers' and multiple choice's."
        )
    if task.output.problem_type == "multi_label_classification":
        raise ValueError(
            f"Task {task.name!r} decides each label on its own sigmoid against the card's threshold: one "
            "temperature over its labels is not fitted here."
        )
    split = split or task.validation_splits[0]
    data_dir = data_dir or stored.data_args.get("data_dir")
    rows, origin = located_split(task, split, data_dir)
    if said := absent_columns(task, rows, origin, task.text_fields()):  # (not "example 0 has no field")
        raise TaskDataError(said)
    try:
        outputs, labels = split_outputs(
            clf, rows.to_list(), name=f"Split {split!r} of task {task.name!r}", where=origin.of
        )
    except TaskDataError as exc:
        raise TaskDataError(origin.explain(str(exc))) from None
    head = clf.head.float()
    if isinstance(head, ClassificationHead) and separated(outputs, labels.to(outputs.device)):
        raise ValueError(
            f"Split {split!r} of task {task.name!r} fits no temperature: the model scores the right "
            f"answer highest (or tied) on all its {len(labels)} examples, so their likelihood only grows "
            "as T falls to 0 (fully sure of every answer); calibrate on a larger split, or one it gets "
            "some wrong (--split)."
        )
    temperature = fit_temperature(outputs, labels.to(outputs.device), head.losses)
    if isinstance(head, ClassificationHead) and no_better_than_uniform(
        outputs, labels.to(outputs.device), head.losses, temperature
    ):
        raise ValueError(
            f"Split {split!r} of task {task.name!r} fits no temperature: over its {len(labels)} examples "
            "the model scores the right answer no higher than the average answer (no better than "
            "chance), so their likelihood only grows as T grows (every answer equally likely); train "
            "it further, or calibrate on another split (--split)."
        )

    def ece(t: float) -> float:
        probabilities = head.probabilities(outputs.float() / t)
        return float(task.output.calibration(probabilities, labels).get("ece", float("nan")))

    was, stored.temperature = stored.temperature, temperature  # refitted from the raw outputs
    saved, staged = hidden_beside(output), None  # under hidden names: a file written there meanwhile is kept
    with writing(output):
        try:
            if tokenizer is not None:  # staged beside: one there (to be replaced) stays if the save fails
                tokenizer.parent.mkdir(parents=True, exist_ok=True)  # --output's folder, new maybe
                staged = tempfile.mkdtemp(".partial", f".{tokenizer.name}.", tokenizer.parent)
                shutil.copytree(stored.tokenizer, staged, dirs_exist_ok=True)
                stored.tokenizer = tokenizer.name
            stored.save(saved)
            put_in_place(saved, output, overwrite=overwrite)
            if staged is not None:
                shutil.rmtree(tokenizer, ignore_errors=True)
                os.replace(staged, tokenizer)
        finally:
            saved.unlink(missing_ok=True)
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
    found = {"temperature": temperature, "ece_before": ece(was), "ece_after": ece(temperature)}
    own = f" (at the checkpoint's own temperature {was:.4f})" if was != 1.0 else ""
    unlabelled = len(rows) - len(labels)  # (rows whose label is empty or one the card ignores)
    left = f", {unlabelled} without a label left out" if unlabelled else ""
    print(
        f"temperature {temperature:.4f} from {len(labels)} examples of split {split!r}{left}: expected "
        f"calibration error {found['ece_before']:.4f}{own} -> {found['ece_after']:.4f}; wrote {output}"
    )
    return found
