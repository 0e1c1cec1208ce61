"""Per-class reports, confusion matrices and the calibration error, on hand-computed cases; what
`validate` writes beside its logs."""

from __future__ import annotations

import pytest
import torch

from gpt_ft.adapters import MultiLabel, SingleText
from gpt_ft.training.reports import report_text


def test_per_class_report_and_confusion_matrix_by_hand():
    task = SingleText(name="t", labels=["a", "b", "c"])
    predictions, labels = torch.tensor([0, 0, 1, 1, 2]), torch.tensor([0, 1, 1, 1, 2])
    rows = task.per_class(predictions, labels)
    # a: 1 right of 2 predicted, 1 of 1 true; b: 2 of 2 predicted, 2 of 3 true; c: 1 of 1, 1 of 1.
    assert rows["a"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert rows["b"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert rows["c"] == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1})
    confusion = task.confusion(predictions, labels)
    assert confusion.tolist() == [[1, 0, 0], [1, 2, 0], [0, 0, 1]]
    text = report_text(task, "validation", rows, confusion)
    assert "| b | 1.0000 | 0.6667 | 0.8000 | 3 |" in text
    assert "| b | 1 | 2 | 0 |" in text


def test_per_label_report_of_a_multi_label_task():
    task = MultiLabel(name="m", labels=["x", "y"])
    predictions = torch.tensor([[1, 0], [1, 1], [0, 1]])
    labels = torch.tensor([[1, 0], [0, 1], [0, 1]])
    rows = task.per_class(predictions, labels)
    assert rows["x"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert rows["y"] == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2})
    assert task.confusion(predictions, labels) is None


def test_expected_calibration_error_by_hand():
    task = SingleText(name="t", labels=["a", "b"])
    probabilities = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 1, 0])
    # Each confidence in a bin of its own: right at 0.9, wrong at 0.8, right at 0.7 and at 0.6.
    expected = (abs(1 - 0.9) + abs(0 - 0.8) + abs(1 - 0.7) + abs(1 - 0.6)) / 4
    assert float(task.calibration(probabilities, labels)["ece"]) == pytest.approx(expected, abs=1e-6)


def test_validate_writes_the_report_beside_its_logs(finetuned, tmp_path, capsys):
    from gpt_ft.cli import main

    main(
        [
            "validate",
            f"--ckpt_path={finetuned.ckpt}",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    out = capsys.readouterr().out
    reports = tmp_path / "lightning_logs" / "version_0" / "reports"
    assert (reports / "validation_confusion.png").stat().st_size > 0
    text = (reports / "validation.md").read_text()
    assert text.startswith("# sent: validation\n\n| class | precision | recall | F1 | support |")
    assert "validation: precision / recall / F1 / support per class" in out
    assert "validation/ece" in out
