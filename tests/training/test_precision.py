"""bf16 on the CPU: kept where it is faster, otherwise 32-true with one line saying why; forced
(GPT_FT_CPU_BF16=always), every path runs in bf16-mixed with losses close to fp32's."""

from __future__ import annotations

import csv

import pytest
import torch

from gpt_ft.cli import main
from gpt_ft.data.batches import collate, collate_shared
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.model.attention import blocked_causal_attention
from gpt_ft.training import precision
from gpt_ft.training.module import GPTModule
from tests.helpers import TINY, random_choice_examples, tiny_gpt

BF16_REL = 2e-2  # bf16-mixed losses stay within 2% of fp32's (bf16 keeps 8 bits of mantissa)


def test_bf16_falls_back_to_fp32_where_it_is_slower_or_missing(monkeypatch):
    monkeypatch.delenv(precision.FORCE, raising=False)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    chosen, why = precision.cpu_precision("bf16-mixed")
    assert chosen == "32-true"
    assert why == (
        "This CPU has no bf16 matrix instructions (AVX-512 BF16 or AMX): running in 32-true instead of "
        "bf16-mixed (GPT_FT_CPU_BF16=always keeps bf16)."
    )
    # fp16-mixed, which Lightning runs as bf16-mixed on a CPU, falls back likewise (not emulated)
    chosen, why = precision.cpu_precision("16-mixed")
    assert chosen == "32-true" and why.endswith(
        "running in 32-true instead of 16-mixed (bf16-mixed on a CPU) (GPT_FT_CPU_BF16=always keeps bf16)."
    )
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 0.53)
    chosen, why = precision.cpu_precision("bf16-true")
    assert chosen == "32-true" and why.startswith("On this CPU bf16 matrix products run at 0.53x the speed")
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 3.9)
    assert precision.cpu_precision("bf16-mixed") == ("bf16-mixed", None)
    assert precision.cpu_precision("16-mixed") == ("bf16-mixed", None)
    assert precision.cpu_precision("32-true") == ("32-true", None)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 0.53)
    monkeypatch.setenv(precision.FORCE, "always")
    assert precision.cpu_precision("bf16-mixed") == ("bf16-mixed", None)


def test_the_probe_measures_a_ratio():
    assert 0 < precision.bf16_matmul_speedup(n=128, repeats=1) < 100  # emulated bf16 can be 100x slower


def lm_loss(gpt, ids, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = gpt.lm_logits(gpt(ids[:, :-1]))
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())


@pytest.mark.parametrize("pre_ln", [False, True])
def test_bf16_mixed_loss_and_gradients_stay_close_to_fp32(pre_ln):
    torch.manual_seed(0)
    gpt = tiny_gpt(pre_ln=pre_ln, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    # A few steps of training first, so that the loss is not just log(vocab) of a random model.
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-2)
    ids = torch.randint(0, TINY["vocab_size"] // 4, (4, 33))
    for _ in range(20):
        lm_loss(gpt, ids, False).backward()
        opt.step()
        opt.zero_grad()
    grads = []
    for bf16 in (False, True):
        loss = lm_loss(gpt, ids, bf16)
        loss.backward()
        grads.append((loss.detach(), torch.cat([p.grad.flatten() for p in gpt.parameters()])))
        gpt.zero_grad()
    (fp32, g32), (bf16, g16) = grads
    assert fp32 < 3.0  # trained well below log(101) = 4.6
    assert abs(bf16 - fp32) / fp32 < BF16_REL
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99


def test_blocked_attention_in_bf16_equals_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 300, 16) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        blocked = blocked_causal_attention(q, k, v, None, dropout_p=0.0, block=128)
    assert blocked.dtype == torch.bfloat16
    torch.testing.assert_close(blocked.float(), expected, rtol=0, atol=3e-2)


def test_shared_context_in_bf16_matches_the_plain_layout(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    rows, task = random_choice_examples(specials, vocab=len(tok) - 5)
    torch.manual_seed(0)
    module = GPTModule(preset="gpt-micro", overrides={"n_positions": 64}, vocab_size=len(tok), task=task)
    module.eval()
    losses = {}
    for name, batch in (
        ("plain", collate(rows, specials.pad)),
        ("shared", collate_shared(rows, specials.pad, specials.delim)),
    ):
        for bf16 in (False, True):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                losses[name, bf16] = module.losses(batch)[0].float()
    assert abs(losses["shared", True] - losses["plain", True]) / losses["plain", False] < BF16_REL
    assert abs(losses["shared", True] - losses["shared", False]) / losses["shared", False] < BF16_REL


def test_fit_validate_predict_and_generate_in_bf16_mixed(tmp_path, finetuned, monkeypatch, capsys):
    """Forced bf16-mixed through the CLI: the fp32 checkpoint validates to the same metrics within
    the tolerance, predicts, fine-tunes on (weights stay fp32), and generates."""
    monkeypatch.setenv(precision.FORCE, "always")
    quiet = [
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    metrics = {}
    for p in ("32-true", "bf16-mixed"):  # (the logged values: the printed ones' 4 decimals may agree)
        logged = [f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
                  f"--trainer.logger.init_args.save_dir={tmp_path / p}"]  # fmt: skip
        main(["validate", f"--ckpt_path={finetuned.ckpt}", f"--trainer.precision={p}", *logged])
        (csv_file,) = (tmp_path / p).rglob("metrics.csv")
        metrics[p] = {k: float(v) for k, v in csv.DictReader(csv_file.open()).__next__().items() if v}
    assert metrics["32-true"]["validation/accuracy"] == metrics["bf16-mixed"]["validation/accuracy"]
    fp32, bf16 = metrics["32-true"]["validation/loss"], metrics["bf16-mixed"]["validation/loss"]
    assert bf16 != fp32 and abs(bf16 - fp32) / fp32 < BF16_REL  # bf16 did run, and stays close
    out = tmp_path / "pred"
    main(["predict", f"--ckpt_path={finetuned.ckpt}", "--trainer.precision=bf16-mixed",
          f"--model.predictions_dir={out}", *quiet])  # fmt: skip
    assert (out / "SENT.tsv").read_text().splitlines()[0] == "index\tprediction"
    logs = tmp_path / "logs"
    data = [f"--data.task={finetuned.card}", f"--data.data_dir={finetuned.root}", "--data.max_length=64"]
    main(["fit", f"--model.init_from={finetuned.ckpt}", *data, "--trainer.max_steps=2",
          "--trainer.precision=bf16-mixed", f"--trainer.default_root_dir={logs}",
          "--trainer.enable_progress_bar=false"])  # fmt: skip
    (last,) = logs.rglob("last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    assert {t.dtype for t in state.values() if t.is_floating_point()} == {torch.float32}
    capsys.readouterr()
    for p in ("bf16-mixed", "bf16-true"):
        main(
            [
                "generate",
                f"--ckpt_path={finetuned.ckpt}",
                "--prompt=the cat",
                "--max_new_tokens=5",
                f"--precision={p}",
            ]
        )
        assert capsys.readouterr().out.startswith("the cat")


def test_generate_says_when_it_falls_back(finetuned, monkeypatch, capsys):
    monkeypatch.delenv(precision.FORCE, raising=False)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    main(
        [
            "generate",
            f"--ckpt_path={finetuned.ckpt}",
            "--prompt=the",
            "--max_new_tokens=2",
            "--precision=bf16-mixed",
        ]
    )
    assert "running in 32-true instead of bf16-mixed" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_gold_scores_reach_the_heads_exact_under_half_precision(precision):
    """`bf16-true` and `16-true` cast every floating-point tensor of a batch before any hook sees it
    (3.8 in bf16 is 3.796875): scores and score rows travel as bits and reach the heads as float32,
    class ids as they were."""
    from lightning.pytorch.plugins.precision import HalfPrecision

    from gpt_ft.data.batches import collate_packed, gold

    plugin = HalfPrecision(precision)
    for labels in ([3.8, 0.2, 4.6, 2.5], [[3.8, 1.0], [0.2, 2.0], [4.6, 3.0], [2.5, 4.0]], [0, 1, 1, 0]):
        examples = [
            {"input_ids": [[1, 5 + i, 2]], "extract_index": [2], "label": label, "index": i}
            for i, label in enumerate(labels)
        ]
        for batch in (collate(examples, 0), collate_packed(examples, 0)):
            arrived = gold(plugin.convert_input(batch).labels)
            expected = torch.tensor(labels, dtype=torch.long if labels[0] == 0 else torch.float32)
            assert arrived.dtype == expected.dtype and torch.equal(arrived, expected)


def test_a_bf16_true_run_scores_against_the_exact_gold(tmp_path, tokenizer_dir):
    """Validation under `bf16-true`, from the data module or its loaders alone: callbacks see the
    gold scores as float32 and the Pearson correlation is of them (3.8 read as 3.796875 moves it)."""
    import lightning as L

    from gpt_ft.adapters import LocalFiles, Similarity
    from gpt_ft.data.task_data import TaskDataModule

    golds = [3.8, 0.2, 4.6, 2.3, 1.1, 3.3]  # none exact in bf16
    rows = "".join(f"the cat {'sat ' * i}\ta dog ran\t{s}\n" for i, s in enumerate(golds))
    (tmp_path / "dev.tsv").write_text("sentence1\tsentence2\tscore\n" + rows)
    local = LocalFiles(splits={"validation": "dev.tsv"})
    task = Similarity(name="sts", regression=True, label="score", metrics=["pearson"], local=local)
    data = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), batch_size=3, max_length=32)
    torch.manual_seed(0)
    module = GPTModule(preset="gpt-micro", vocab_size=data.vocab_size, task=task)
    seen, predictions = [], []

    class Record(L.Callback):
        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            seen.append(batch.labels)
            predictions.append(pl_module(batch).squeeze(-1).float())

    trainer = L.Trainer(precision="bf16-true", callbacks=[Record()], logger=False, enable_progress_bar=False)
    data.setup("validate")
    for given in ({"datamodule": data}, {"dataloaders": data.val_dataloader()}):  # with its hooks or not
        seen.clear(), predictions.clear()
        (metrics,) = trainer.validate(module, **given, verbose=False)
        labels = torch.cat(seen)
        assert labels.dtype == torch.float32 and torch.equal(labels, torch.tensor(golds))
        expected = torch.corrcoef(torch.stack([torch.cat(predictions), labels]))[0, 1]
        assert metrics["validation/pearson"] == pytest.approx(float(expected), rel=1e-5)


def test_training_half_precision_weights_is_said_to_lose_small_updates():
    """At fine-tuning's learning rate a bf16 weight near 1 never moves (its spacing is 1/128): the
    LayerNorm gains stayed exactly as loaded. Said once before `fit`; mixed precision says nothing."""
    import warnings

    weight = torch.ones(4, dtype=torch.bfloat16)
    weight.add_(torch.full((4,), 6.25e-5, dtype=torch.bfloat16))
    assert torch.equal(weight, torch.ones(4, dtype=torch.bfloat16))
    from jsonargparse import Namespace

    from gpt_ft.training.runs import _recipe_length  # what a fit's configuration goes through

    with pytest.warns(UserWarning, match="--trainer.precision bf16-true trains 16-bit weights: an update"):
        _recipe_length(Namespace(trainer=Namespace(precision="bf16-true", max_epochs=1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p in ("bf16-mixed", "32-true", None, 32):
            precision.warn_half_weights(p)


def test_float16_weights_are_refused_for_training(finetuned, tmp_path, monkeypatch, capsys, caplog):
    """AdamW on float16 weights keeps its moments in float16: a small gradient's square underflows
    to 0 and the step lr·m/eps blows the weight up (three steps at 6.25e-5 of gradients 1e-4 reach
    inf), so `fit` refuses 16-true. And bf16-true on a CPU that runs it in 32-true says only that."""
    import warnings

    weight = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
    adamw = torch.optim.AdamW([weight], lr=6.25e-5, foreach=False)
    for _ in range(3):
        weight.grad = torch.full((4,), 1e-4, dtype=torch.float16)
        adamw.step()
    assert adamw.state[weight]["exp_avg_sq"].eq(0).all() and not weight.isfinite().any()
    args = ["fit", f"--model.init_from={finetuned.ckpt}", f"--data.task={finetuned.card}",
            f"--data.data_dir={finetuned.root}", "--data.max_length=64", "--trainer.max_steps=1",
            "--trainer.logger=false", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false"]  # fmt: skip
    with pytest.raises(SystemExit):
        main([*args, "--trainer.precision=16-true"])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "error: --trainer.precision 16-true keeps AdamW's moments in float16, where a small gradient's "
            "square underflows to 0 and its weight's step (lr * m / eps) blows up: train in bf16-mixed, "
            "16-mixed or bf16-true."
        )
    )
    monkeypatch.delenv(precision.FORCE, raising=False)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        main([*args, "--trainer.precision=bf16-true"])
    assert not [w for w in said if "trains 16-bit weights" in str(w.message)]
    assert "running in 32-true instead of bf16-true" in caplog.text
