"""The shipped configs: every fit config parses (in this process), and the quickstart learns (in a
process of its own, in the background)."""

import csv

import pytest

from gpt_ft.cli import main
from tests.background import gpt_ft
from tests.helpers import ROOT, cuda

FIT_CONFIGS = [p.relative_to(ROOT) for p in (ROOT / "configs").rglob("*.yaml") if p.parent.name != "suites"]


@pytest.mark.parametrize("config", sorted(FIT_CONFIGS))
def test_every_config_parses(config, tokenizer_dir, monkeypatch, capsys):
    """Pretraining configs with a token folder, the others with a task card (suites: tests/eval)."""
    monkeypatch.chdir(ROOT)
    if config.parts[1] == "pretrain":
        data, expected = ["--data.token_dir", "tokens"], "class_path: gpt_ft.data.lm_data.LMDataModule"
    else:
        data = ["--data.task", "tasks/glue/rte.yaml", "--data.tokenizer", tokenizer_dir]
        expected = "class_path: gpt_ft.adapters.TextPair"
    with pytest.raises(SystemExit) as printed:
        main(["fit", "--config", str(config), *data, "--print_config"])
    out = capsys.readouterr()
    assert printed.value.code == 0, out.err[-2000:]
    assert expected in out.out


def start_quickstart(root):
    return [
        gpt_ft(
            "fit",
            "--config",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.max_epochs=2",
            f"--trainer.logger.init_args.save_dir={root}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            cwd=ROOT,
        )
    ]


@pytest.mark.background(start=start_quickstart)
def test_quickstart_learns(background):
    """configs/quickstart.yaml, shortened to 2 epochs: validation accuracy climbs well above chance."""
    (out,) = background.runs
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("epoch ")]
    accuracy = [float(ln.split("validation/accuracy ")[1].split(",")[0]) for ln in lines]
    assert len(accuracy) == 2 and accuracy[1] > accuracy[0] and accuracy[1] > 0.9  # chance is about 0.5


@cuda
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_cuda_quickstart_through_the_gpu_config(tmp_path, monkeypatch, compile):
    """configs/trainer/gpu.yaml (bf16-mixed, fused AdamW) on the quickstart: one epoch learns."""
    monkeypatch.chdir(ROOT)
    main(["fit", "--config", "configs/quickstart.yaml", "--config", "configs/trainer/gpu.yaml",
          "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}", f"--model.compile={compile}",
          "--trainer.enable_progress_bar=false"])  # fmt: skip
    (metrics,) = tmp_path.rglob("metrics.csv")
    with open(metrics) as f:
        accuracy = [
            float(r["validation/accuracy"]) for r in csv.DictReader(f) if r.get("validation/accuracy")
        ]
    assert accuracy and accuracy[-1] > 0.7  # chance is about 0.5; fp32 on a CPU reaches 0.78
    assert next(tmp_path.rglob("last.ckpt")).is_file()
