import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import MICRO, ROOT, common_args, write_rows  # noqa: F401

from gpt_ft.cli import main

CARDS = {
    "single": """class_path: gpt_ft.adapters.SingleText
init_args:
  name: sent
  labels: [negative, positive]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv, test: d/test.tsv}, columns: {index: idx}}
  submission_files: {test: SENT.tsv}
""",
    "pair": """class_path: gpt_ft.adapters.TextPair
init_args:
  name: pair
  premise: sentence1
  hypothesis: sentence2
  labels: [entailment, not_entailment]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv, test: d/test.tsv}, columns: {index: idx}}
""",
    "similarity": """class_path: gpt_ft.adapters.Similarity
init_args:
  name: sts
  regression: true
  score_range: [0, 5]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv, test: d/test.tsv}, columns: {index: idx}}
  submission_files: {test: STS-B.tsv}
""",
    "choice": """class_path: gpt_ft.adapters.MultipleChoice
init_args:
  name: mc
  context: [story]
  choices: [end1, end2]
  labels: ['1', '2']
  local: {splits: {train: d/train.csv, validation: d/dev.csv, test: d/test.csv}}
""",
}


def make_task(kind: str, root: Path) -> Path:
    good, bad = "the cat sat on the mat .", "two dogs run in a park ."
    for split, n in (("train", 6), ("dev", 5), ("test", 3)):
        labelled = split != "test"
        if kind == "single":
            rows = [[i, good if i % 2 else bad, i % 2] for i in range(n)]
            header = ["index", "sentence", "label"]
        elif kind == "pair":
            rows = [[i, good, bad, ["entailment", "not_entailment"][i % 2]] for i in range(n)]
            header = ["index", "sentence1", "sentence2", "label"]
        elif kind == "similarity":
            rows = [[i, good, bad, f"{i % 5}.5"] for i in range(n)]
            header = ["index", "sentence1", "sentence2", "label"]
        else:
            rows = [[good, "He is happy now.", "He joined a gang.", 1 + i % 2] for i in range(n)]
            header = ["story", "end1", "end2", "label"]
        if not labelled:
            header, rows = header[:-1], [r[:-1] for r in rows]
        write_rows(root / "d" / f"{split}.{'csv' if kind == 'choice' else 'tsv'}", header, rows)
    card = root / f"{kind}.yaml"
    card.write_text(CARDS[kind])
    return card


@pytest.mark.parametrize("kind", ["single", "pair", "similarity", "choice"])
def test_fit_validate_predict_for_each_adapter_kind(kind, tmp_path, tokenizer_dir, capsys):
    card = make_task(kind, tmp_path)
    args = common_args(card, tokenizer_dir, tmp_path)
    main(["fit", *args, "--trainer.max_epochs=2", f"--model.predictions_dir={tmp_path / 'pred'}"])
    out = capsys.readouterr().out
    metric = {"similarity": "validation/pearson"}.get(kind, "validation/accuracy")
    assert "epoch 1 step 4: " in out and metric in out
    best = list((tmp_path / "runs").rglob("best-*.ckpt"))
    last = list((tmp_path / "runs").rglob("last.ckpt"))
    assert len(best) == 1 and len(last) == 1
    main(["validate", *args, f"--ckpt_path={last[0]}"])
    main(["predict", *args, f"--ckpt_path={last[0]}", f"--model.predictions_dir={tmp_path / 'pred'}"])
    files = list((tmp_path / "pred").iterdir())
    assert len(files) == 1
    lines = files[0].read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == ["0", "1", "2"]
    values = [line.split("\t")[1] for line in lines[1:]]
    expected_name, allowed = {
        "single": ("SENT.tsv", {"negative", "positive"}),
        "pair": ("pair-test.tsv", {"entailment", "not_entailment"}),
        "choice": ("mc-test.tsv", {"1", "2"}),
    }.get(kind, ("STS-B.tsv", None))
    assert files[0].name == expected_name
    if allowed:
        assert set(values) <= allowed
    else:
        assert all(0.0 <= float(v) <= 5.0 and len(v.split(".")[1]) == 3 for v in values)


def test_quickstart_learns(tmp_path):
    """configs/quickstart.yaml, shortened: validation accuracy climbs well above chance."""
    args = [
        "fit",
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        "--trainer.max_epochs=2",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    out = subprocess.run([sys.executable, "-m", "gpt_ft", *args], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("epoch ")]
    accuracy = [float(ln.split("validation/accuracy ")[1].split(",")[0]) for ln in lines]
    assert len(accuracy) == 2 and accuracy[1] > accuracy[0] and accuracy[1] > 0.9  # chance is about 0.5


FIT_CONFIGS = [p.relative_to(ROOT) for p in (ROOT / "configs").rglob("*.yaml") if p.parent.name != "suites"]


@pytest.mark.parametrize("config", sorted(FIT_CONFIGS))
def test_every_config_parses(config, tokenizer_dir):
    """Pretraining configs with a token folder, the others with a task card (suites: test_suite.py)."""
    if config.parts[1] == "pretrain":
        data, expected = ["--data.token_dir", "tokens"], "class_path: gpt_ft.data.lm_data.LMDataModule"
    else:
        data = ["--data.task", "tasks/glue/rte.yaml", "--data.tokenizer", tokenizer_dir]
        expected = "class_path: gpt_ft.adapters.TextPair"
    out = subprocess.run(
        [sys.executable, "-m", "gpt_ft", "fit", "--config", str(config), *data, "--print_config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert expected in out.stdout


ADAPTER = '''
from gpt_ft.adapters import Encoded, TaskAdapter


class TripleText(TaskAdapter):
    """[start] a [delim] b [delim] c [extract]: an input shape gpt_ft does not ship."""

    def __init__(self, *, fields: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.fields = fields

    def text_fields(self):
        return self.fields

    def encode(self, example, tokens, specials, max_length):
        ids, extract = self._sequence(specials, *(t[: (max_length - 4) // 3] for t in tokens))
        return Encoded([ids], [extract], self.example_label(example))
'''


def test_an_adapter_defined_outside_gpt_ft_works_through_its_card(tmp_path, tokenizer_dir):
    (tmp_path / "my_tasks.py").write_text(ADAPTER)
    write_rows(
        tmp_path / "d/train.tsv", ["a", "b", "c", "label"], [["one", "two", "three", i % 2] for i in range(4)]
    )
    write_rows(tmp_path / "d/dev.tsv", ["a", "b", "c", "label"], [["one", "two", "three", 1]])
    card = tmp_path / "triple.yaml"
    card.write_text(
        "class_path: my_tasks.TripleText\ninit_args:\n  name: triple\n  fields: [a, b, c]\n"
        "  labels: ['no', 'yes']\n  local: {splits: {train: d/train.tsv, validation: d/dev.tsv}}\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    base = [sys.executable, "-m", "gpt_ft"]
    shown = subprocess.run(
        [
            *base,
            "explain",
            f"--data.task={card}",
            f"--data.tokenizer={tokenizer_dir}",
            f"--data.data_dir={tmp_path}",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert '"<|delim|>"' in shown.stdout and shown.stdout.count("<|delim|>") == 2
    fit = subprocess.run(
        [*base, "fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert "validation/accuracy" in fit.stdout


def test_bad_hyperparameter_exits_with_one_sentence(tmp_path, tokenizer_dir):
    card = make_task("single", tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt_ft",
            "fit",
            *common_args(card, tokenizer_dir, tmp_path),
            "--model.lm_coef=-1",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == "gpt-ft: error: lm_coef must be >= 0, got -1.0."
    assert "Traceback" not in out.stderr


def test_init_from_a_finetuned_checkpoint(tmp_path, tokenizer_dir):
    card = make_task("single", tmp_path)
    main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=1"])
    ckpt = next((tmp_path / "runs").rglob("last.ckpt"))
    from gpt_ft.model.weights import load_weights

    gpt = load_weights(ckpt)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(gpt.wte.weight, state["gpt.wte.weight"])


def test_fit_without_checkpointing_writes_no_checkpoint(tmp_path, tokenizer_dir):
    card = make_task("single", tmp_path)
    args = common_args(card, tokenizer_dir, tmp_path)
    main(["fit", *args, "--trainer.max_epochs=1", "--trainer.enable_checkpointing=false"])
    assert not list((tmp_path / "runs").rglob("*.ckpt"))
