"""Per-class reports, confusion matrices and the calibration error, on hand-computed cases; what
`validate` writes beside its logs."""

from __future__ import annotations

import math
import re
import shutil

import pytest
import torch

from gpt_ft.adapters import MultiLabel, SingleText
from gpt_ft.training.reports import report_text


def test_per_class_report_and_confusion_matrix_by_hand():
    task = SingleText(name="t", labels=["a", "b", "c"])
    predictions, labels = torch.tensor([0, 0, 1, 1, 2]), torch.tensor([0, 1, 1, 1, 2])
    rows = task.output.per_class(predictions, labels)
    # a: 1 right of 2 predicted, 1 of 1 true; b: 2 of 2 predicted, 2 of 3 true; c: 1 of 1, 1 of 1.
    assert rows["a"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert rows["b"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert rows["c"] == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1})
    confusion = task.output.confusion(predictions, labels)
    assert confusion.tolist() == [[1, 0, 0], [1, 2, 0], [0, 0, 1]]
    text = report_text(task, "validation", rows, confusion)
    assert "| b | 1.0000 | 0.6667 | 0.8000 | 3 |" in text
    assert "| b | 1 | 2 | 0 |" in text


def test_per_label_report_of_a_multi_label_task():
    task = MultiLabel(name="m", labels=["x", "y"])
    predictions = torch.tensor([[1, 0], [1, 1], [0, 1]])
    labels = torch.tensor([[1, 0], [0, 1], [0, 1]])
    rows = task.output.per_class(predictions, labels)
    assert rows["x"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert rows["y"] == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2})
    assert task.output.confusion(predictions, labels) is None


def test_expected_calibration_error_by_hand():
    task = SingleText(name="t", labels=["a", "b"])
    probabilities = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 1, 0])
    # Each confidence in a bin of its own: right at 0.9, wrong at 0.8, right at 0.7 and at 0.6.
    expected = (abs(1 - 0.9) + abs(0 - 0.8) + abs(1 - 0.7) + abs(1 - 0.6)) / 4
    assert float(task.output.calibration(probabilities, labels)["ece"]) == pytest.approx(expected, abs=1e-6)
    # A confidence of exactly 1 shares the last bin, (14/15, 1], with 0.96 (Guo et al.'s bins): wrong
    # at 1.0 and right at 0.96 is |(0 - 1) + (1 - 0.96)| / 2 = 0.48, not 0.52 from bins of their own.
    probabilities = torch.tensor([[1.0, 0.0], [0.04, 0.96]])
    ece = task.output.calibration(probabilities, torch.tensor([1, 1]))["ece"]
    assert float(ece) == pytest.approx(0.48, abs=1e-6)
    # A model whose outputs are NaN (its weights diverged) has an error of NaN, not an index past the bins.
    assert task.output.calibration(torch.full((2, 2), float("nan")), torch.tensor([0, 1]))["ece"].isnan()


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


def test_calibration_lowers_the_ece_of_an_over_confident_model_and_keeps_its_predictions(
    finetuned, tmp_path, capsys
):
    from gpt_ft.cli import main
    from gpt_ft.eval.classifier import Classifier
    from gpt_ft.weights.checkpoint import safe_load

    stored = safe_load(finetuned.ckpt)
    for key in ("head.weight", "head.bias"):  # 300 times as sure of everything
        stored["state_dict"][key] = stored["state_dict"][key] * 300
    sure = tmp_path / "sure" / "sure.ckpt"  # beside a copy of the run's tokenizer, as fit leaves them
    shutil.copytree(finetuned.ckpt.parent / "tokenizer", sure.parent / "tokenizer")
    torch.save(stored, sure)
    # Labels the model knows 3 times in 4: each sentence's rows say its answer but for one (right 75% of
    # the time, scored 300 times as sure: T > 1, finite).
    texts = ["the cat sat on the mat ."] * 4 + ["a dog ."] * 4
    said = Classifier.from_checkpoint(sure, device="cpu").predict([{"sentence": t} for t in texts])
    answer = {"negative": 0, "positive": 1}
    rows = [f"{i}\t{t}\t{answer[o['label']] ^ (i % 4 == 0)}" for i, (t, o) in enumerate(zip(texts, said))]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "dev.tsv").write_text("index\tsentence\tlabel\n" + "\n".join(rows) + "\n")
    calibrated = tmp_path / "calibrated.ckpt"
    main(["calibrate", f"--ckpt_path={sure}", f"--output={calibrated}", f"--data_dir={tmp_path}"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    t, before, after = (float(x) for x in re.findall(r"\d+\.\d+", line)[:3])
    assert t > 5 and after < before - 0.1, line
    assert line.startswith(f"temperature {t:.4f} from 8 examples of split 'validation': expected"), line
    examples = [{"sentence": r.split("\t")[1]} for r in rows]
    hot, cool = (
        Classifier.from_checkpoint(sure, device="cpu"),
        Classifier.from_checkpoint(calibrated, device="cpu"),
    )
    assert cool.temperature == pytest.approx(t, rel=1e-3)
    hot_out, cool_out = hot.predict(examples), cool.predict(examples)
    assert [o["label"] for o in hot_out] == [o["label"] for o in cool_out]
    assert max(max(o["scores"].values()) for o in cool_out) < max(max(o["scores"].values()) for o in hot_out)
    assert torch.load(sure, weights_only=True).get("temperature") is None  # the input is kept as it was
    # Into a folder not made yet; from the calibrated checkpoint, whose error before is its own.
    again = tmp_path / "new" / "again.ckpt"
    with open(tmp_path / "d" / "dev.tsv", "a") as f:  # and a row without a label: left out, said
        f.write("8\ta dog .\t\n")
    main(["calibrate", f"--ckpt_path={calibrated}", f"--output={again}", f"--data_dir={tmp_path}"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "from 8 examples of split 'validation', 1 without a label left out: expected" in line, line
    assert re.findall(r"\d+\.\d+", line)[1:3] == [f"{after:.4f}", f"{t:.4f}"], line
    assert Classifier.from_checkpoint(again, device="cpu").temperature == pytest.approx(t, rel=1e-3)
    # A save that fails (a full disk) over an earlier output keeps it whole: its file and tokenizer.
    from gpt_ft.weights.checkpoint import Checkpoint

    def full(self, path):
        raise OSError(28, "No space left on device", str(path))

    (tmp_path / "calibrated.tokenizer" / "marker").write_text("the earlier one")
    kept = {f: f.read_bytes() for f in tmp_path.glob("calibrated*/**/*") if f.is_file()}
    kept[calibrated] = calibrated.read_bytes()
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit):
        patch.setattr(Checkpoint, "save", full)
        main(["calibrate", f"--ckpt_path={sure}", f"--output={calibrated}", f"--data_dir={tmp_path}",
              "--overwrite=true"])  # fmt: skip
    assert "No space left on device" in capsys.readouterr().err
    assert all(f.read_bytes() == kept_bytes for f, kept_bytes in kept.items())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing staged left
    # Another run writing the same --output meanwhile: its file is kept, this one refused (both said
    # "wrote", the last one's file left).
    raced, save = tmp_path / "raced.ckpt", Checkpoint.save

    def meanwhile(self, path):
        save(self, path)
        raced.write_bytes(b"another run's")

    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit):
        patch.setattr(Checkpoint, "save", meanwhile)
        main(["calibrate", f"--ckpt_path={sure}", f"--output={raced}", f"--data_dir={tmp_path}"])
    assert f"--output {raced} was written by another process while this one ran" in capsys.readouterr().err
    assert raced.read_bytes() == b"another run's"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # Labels it cannot know (each sentence's rows half one answer, half the other): refused, nothing written.
    rows = [f"{i}\t{t}\t{i % 2}" for i, t in enumerate(texts)]
    (tmp_path / "d" / "dev.tsv").write_text("index\tsentence\tlabel\n" + "\n".join(rows) + "\n")
    flat = tmp_path / "flat.ckpt"
    with pytest.raises(SystemExit):
        main(["calibrate", f"--ckpt_path={sure}", f"--output={flat}", f"--data_dir={tmp_path}"])
    assert "the model scores the right answer no higher than the average answer" in capsys.readouterr().err
    assert not flat.exists()


def test_calibration_refuses_a_split_the_model_gets_all_right(finetuned, tmp_path, capsys):
    """Every example right: the likelihood grows as T falls to 0, and a T fitted there would make
    every later answer fully sure; refused in one sentence, nothing written. One wrong answer
    among them and T is finite."""
    from gpt_ft.cli import main
    from gpt_ft.eval.classifier import Classifier

    texts = ["the cat sat on the mat .", "a dog .", "two dogs run in a park .", "he is happy now ."]
    said = [o["label"] for o in Classifier.from_checkpoint(finetuned.ckpt, device="cpu").predict(
        [{"sentence": t} for t in texts])]  # fmt: skip
    labels = {"negative": 0, "positive": 1}
    (tmp_path / "d").mkdir()
    for wrong in (None, 0):
        rows = [f"{i}\t{t}\t{labels[p] ^ (i == wrong)}" for i, (t, p) in enumerate(zip(texts, said))]
        (tmp_path / "d" / "dev.tsv").write_text("index\tsentence\tlabel\n" + "\n".join(rows) + "\n")
        out = tmp_path / f"calibrated-{wrong}.ckpt"
        argv = ["calibrate", f"--ckpt_path={finetuned.ckpt}", f"--output={out}", f"--data_dir={tmp_path}"]
        if wrong is None:
            with pytest.raises(SystemExit) as stopped:
                main(argv)
            assert stopped.value.code == 2 and not out.exists()
            assert capsys.readouterr().err.strip().splitlines()[-1] == (
                "gpt-ft: error: Split 'validation' of task 'sent' fits no temperature: the model scores the "
                "right answer highest (or tied) on all its 4 examples, so their likelihood only grows as T "
                "falls to 0 (fully sure of every answer); calibrate on a larger split, or one it gets some "
                "wrong (--split)."
            )
        else:
            main(argv)
            assert 0.01 < Classifier.from_checkpoint(out, device="cpu").temperature < 100
    # A split without the text's column: named with its file, as validate names it ("example 0 has no
    # field 'sentence'" before).
    (tmp_path / "d" / "dev.tsv").write_text("index\tlabel\n0\t1\n")
    with pytest.raises(SystemExit) as stopped:
        main([*argv[:2], f"--output={tmp_path / 'c.ckpt'}", argv[3]])
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {tmp_path / 'd' / 'dev.tsv'}: missing column(s) ['sentence'] needed by task 'sent'; "
        "the file has ['index', 'label']."
    )


def test_a_split_with_no_wrong_answer_is_separated_ties_included():
    """A tie (two identical endings, scored alike) still lets the loss fall as T falls."""
    import torch.nn.functional as F

    from gpt_ft.eval.calibration import fit_temperature, separated

    right = torch.tensor([[2.0, 0.5, -1.0]] * 9)
    labels = torch.zeros(10, dtype=torch.long)
    tied, wrong = (
        torch.cat([right, torch.tensor([[1.0, 1.0, -3.0]])]),
        torch.cat([right, torch.tensor([[0.0, 1.0, -3.0]])]),
    )
    assert separated(tied, labels) and not separated(wrong, labels)
    masked = torch.tensor([[1.0, torch.finfo(torch.float32).min]])  # a choice the row lacks
    assert separated(masked, torch.tensor([0])) and not separated(masked, torch.tensor([1]))
    losses = lambda o, y: F.cross_entropy(o, y, reduction="none")  # noqa: E731
    assert fit_temperature(tied, labels, losses) < 0.1 < fit_temperature(wrong, labels, losses)


def test_a_model_no_better_than_chance_fits_no_temperature():
    """Right answers no higher than the mean answer on average: the loss only falls as T grows (a
    fitted T of 2.6e8 flattened every probability to 1/k); a margin above 0 and T is finite."""
    import torch.nn.functional as F

    from gpt_ft.eval.calibration import fit_temperature, no_better_than_uniform

    losses = lambda o, y: F.cross_entropy(o, y, reduction="none")  # noqa: E731
    labels = torch.tensor([0, 1, 0, 1])
    for gap, chance in ((0.0, True), (-0.25, True), (0.25, False)):
        logits = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # 2 right, 2 wrong
        logits[0, 0] += 2 * gap  # the mean margin over the mean answer: gap / 2
        t = fit_temperature(logits, labels, losses)
        assert no_better_than_uniform(logits, labels, losses, t) == chance and (t < 100) != chance
    low = torch.finfo(torch.float32).min  # a choice the row lacks: 2 answers, not 3
    masked, labels = torch.tensor([[1.0, 0.0, low], [0.5, 0.0, low]]), torch.tensor([0, 1])
    assert not no_better_than_uniform(masked, labels, losses, fit_temperature(masked, labels, losses))


def test_calibration_leaves_out_the_rows_whose_label_the_card_ignores(tokenizer_dir):
    """SNLI's '-' rows: out of the split `validate` scores, and of the one calibration fits on."""
    from gpt_ft import GPT, GPTConfig
    from gpt_ft.adapters import SingleText
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.calibration import split_outputs
    from gpt_ft.eval.classifier import Classifier

    task = SingleText(name="t", labels=["negative", "positive"], ignore_labels=["-"])
    tokenizer = load_tokenizer(tokenizer_dir)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=len(tokenizer), n_positions=64)).eval()
    head = task.head(gpt.config.n_embd, dropout=0.0, init_std=0.02)
    clf = Classifier(gpt, head, task, tokenizer, max_length=64, device="cpu")
    rows = [{"sentence": "a cat .", "label": "positive"}, {"sentence": "a dog .", "label": "-"},
            {"sentence": "two dogs .", "label": "negative"}]  # fmt: skip
    outputs, labels = split_outputs(clf, rows)
    assert labels.tolist() == [1, 0] and outputs.shape == (2, 2)
    # A float label column (JSON, parquet) spells 2 as 2.0: ignored as the data module ignores it
    # (calibrate refused the row its `validate` left out).
    task = SingleText(name="t", labels=["negative", "positive"], ignore_labels=["2"])
    clf = Classifier(gpt, head, task, tokenizer, max_length=64, device="cpu")
    floats = [{**row, "label": {"positive": 1.0, "-": 2.0, "negative": 0.0}[row["label"]]} for row in rows]
    assert split_outputs(clf, floats)[1].tolist() == [1, 0]
    # Outputs that are not finite (weights gone wrong) fit a NaN temperature, which was written.
    ids = lambda text: set(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    gpt.wte.weight.data[sorted(ids("two dogs .") - ids("a cat ."))] = float("nan")  # the third row's alone
    with pytest.raises(ValueError) as broken:
        split_outputs(
            clf, floats, batch_size=1, name="Split 'validation'", where=lambda i: f"d.jsonl, line {i + 1}"
        )
    assert str(broken.value) == (
        "Split 'validation' fits no temperature: the model's outputs are not finite (NaN or infinite) on 1 "
        "of its 2 examples (the first: d.jsonl, line 3); its weights are broken: train it again."
    )


def test_class_weights_change_the_loss_as_computed_by_hand():
    from gpt_ft.adapters import ClassificationHead, MultiLabelHead

    head = ClassificationHead(4, 2, dropout=0.0)
    outputs, labels = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    plain = head.losses(outputs, labels)
    head.class_weights = torch.tensor([1.0, 3.0])
    # Each example's cross-entropy times its class's weight: -log softmax, by hand.
    by_hand = [
        1.0 * -math.log(math.exp(2) / (math.exp(2) + 1)),
        3.0 * -math.log(math.exp(1) / (1 + math.exp(1))),
        3.0 * math.log(2),
    ]
    assert head.losses(outputs, labels).tolist() == pytest.approx(by_hand, rel=1e-6)
    assert plain.tolist() == pytest.approx([by_hand[0], by_hand[1] / 3, by_hand[2] / 3], rel=1e-6)
    multi = MultiLabelHead(4, 2, threshold=0.5, dropout=0.0)
    multi.class_weights = torch.tensor([4.0, 1.0])  # positives of label 0 count 4 times
    got = multi.losses(torch.tensor([[0.0, 0.0]]), torch.tensor([[1, 0]]))
    assert got.tolist() == pytest.approx([(4 * math.log(2) + math.log(2)) / 2], rel=1e-6)


def test_balanced_weights_from_the_labels():
    task = SingleText(name="t", labels=["a", "b", "c"])
    # n / (classes x n_k): 6 / (3 x 3), 6 / (3 x 2), 6 / (3 x 1)
    assert task.output.balanced_weights(torch.tensor([0, 0, 0, 1, 1, 2])).tolist() == pytest.approx(
        [2 / 3, 1, 2]
    )
    multi = MultiLabel(name="m", labels=["x", "y"])
    assert multi.output.balanced_weights(torch.tensor([[1, 0], [1, 1], [0, 0], [0, 0]])).tolist() == [
        1.0,
        3.0,
    ]
    with pytest.raises(ValueError, match="class weights apply to classification and multi-label tasks"):
        SingleText(name="r", regression=True).output.balanced_weights(torch.tensor([1.0]))


def test_fit_with_balanced_and_listed_class_weights(tmp_path, tokenizer_dir, capsys, monkeypatch):
    from gpt_ft.cli import main
    from gpt_ft.training import checkpointing
    from tests.cli.test_bad_outputs import error
    from tests.helpers import common_args, make_task

    card = make_task("single", tmp_path)
    args = [*common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=1"]
    main(["fit", *args, "--model.class_weights=balanced"])
    last = tmp_path / "runs/lightning_logs/version_0/checkpoints/last.ckpt"
    stored = torch.load(last, weights_only=True)
    assert stored["class_weights"] == [1.0, 1.0]  # make_task's 6 rows: 3 of each class
    # Fitting on with other weights: the run's own apply, as its own learning rate would (the
    # checkpoint's replaced them without a word while hparams.yaml recorded the new ones).
    said = []
    monkeypatch.setattr(checkpointing, "rank_zero_info", said.append)
    main(["fit", *args[:-1], "--trainer.max_epochs=2", "--model.class_weights=[1, 5]", "--ckpt_path=last"])
    newest = max(tmp_path.glob("runs/lightning_logs/version_*/checkpoints/last.ckpt"))
    assert torch.load(newest, weights_only=True)["class_weights"] == [1.0, 5.0]
    assert said == [
        "resumed with other class weights than the checkpoint's [1.0, 1.0], which apply from here on: "
        "[1.0, 5.0]."
    ]
    assert error(capsys, "fit", *args, "--model.class_weights=[1, 2, 3]") == (
        "--model.class_weights [1.0, 2.0, 3.0]: give each of the task's 2 classes a weight >= 0, in id "
        "order, or `balanced`."
    )


@pytest.mark.parametrize(("gap", "right"), [(0.002, 9), (0.002, 7), (1.0, 6)])
def test_the_temperature_fitted_is_the_exact_one_of_a_hand_computed_case(gap, right):
    """Ten examples with logits [0, gap], `right` of them of class 1: the likelihood is best where
    σ(gap / T) = right / 10, T = gap / ln(right / (10 - right)), however small the gap."""
    from gpt_ft.adapters.heads import ClassificationHead
    from gpt_ft.eval.calibration import fit_temperature

    logits = torch.tensor([[0.0, gap]] * 10)
    labels = torch.tensor([1] * right + [0] * (10 - right))
    head = ClassificationHead(4, 2, dropout=0.0, init_std=0.02)
    expected = gap / math.log(right / (10 - right))
    assert fit_temperature(logits, labels, head.losses) == pytest.approx(expected, rel=1e-4)


def test_the_printed_table_lines_up_names_of_wide_characters():
    """Its names were padded by len(): a CJK name (two columns a character) pushed its row's figures
    right of the others'."""
    from gpt_ft.training.reports import shown_width

    assert [shown_width(n) for n in ("neg", "积极", "ne\u0301gatif", "ｐｏｓ")] == [3, 4, 7, 6]
