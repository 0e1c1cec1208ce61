import math
import re
import shutil

import numpy
import pytest
import torch
import torch.nn.functional as F

from gpt_ft.adapters import MultipleChoice, Similarity, SingleText, TextPair
from gpt_ft.data.batches import collate
from gpt_ft.training.module import GPTModule
from gpt_ft.weights.checkpoint import DATA

MICRO = dict(n_positions=32, n_embd=16, n_layer=1, n_head=2, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
START, DELIM, EXTRACT, PAD = 20, 21, 22, 23


def module(task, **kw) -> GPTModule:
    torch.manual_seed(0)
    return GPTModule(
        preset="gpt-micro", overrides=MICRO, vocab_size=24, task=task, classifier_dropout=0.0, **kw
    ).eval()


def linear(head, x):
    """The head's linear layer alone (no dropout, no pooling)."""
    return F.linear(x, head.weight, head.bias)


def example(seqs, label):
    return {"input_ids": seqs, "extract_index": [len(s) - 1 for s in seqs], "label": label, "index": 0}


def test_combined_loss_is_task_plus_lm_coef_times_lm():
    task = TextPair(name="t", labels=["a", "b", "c"])
    batch = collate(
        [example([[START, 1, 2, DELIM, 3, EXTRACT]], 2), example([[START, 4, DELIM, 5, EXTRACT]], 0)], PAD
    )
    m = module(task, lm_coef=0.5)
    loss, parts = m.losses(batch)
    logits = m(batch)
    # By hand: each sequence alone (no padding), its extract row through the head, CE; LM CE on real tokens.
    seqs = [[START, 1, 2, DELIM, 3, EXTRACT], [START, 4, DELIM, 5, EXTRACT]]
    hidden = [m.gpt(torch.tensor([s]))[0] for s in seqs]
    task_logits = torch.stack([linear(m.head, h[-1]) for h in hidden])
    task_loss = F.cross_entropy(task_logits, torch.tensor([2, 0]))
    lm_logits = torch.cat([m.gpt.lm_logits(h[:-1]) for h in hidden])
    lm_loss = F.cross_entropy(lm_logits, torch.tensor([1, 2, DELIM, 3, EXTRACT, 4, DELIM, 5, EXTRACT]))
    torch.testing.assert_close(logits, task_logits)
    torch.testing.assert_close(parts["task_loss"], task_loss)
    torch.testing.assert_close(parts["lm_loss"], lm_loss)
    torch.testing.assert_close(loss, task_loss + 0.5 * lm_loss)
    loss0, parts0 = module(task, lm_coef=0.0).losses(batch)
    assert "lm_loss" not in parts0 and torch.allclose(loss0, task_loss)


def test_similarity_adds_the_two_orders_before_the_head():
    task = Similarity(name="s", regression=True)
    m = module(task)
    ab, ba = [START, 1, DELIM, 2, 3, EXTRACT], [START, 2, 3, DELIM, 1, EXTRACT]
    batch = collate([example([ab, ba], 3.5)], PAD)
    logits = m(batch)
    h_ab, h_ba = m.gpt(torch.tensor([ab]))[0, -1], m.gpt(torch.tensor([ba]))[0, -1]
    torch.testing.assert_close(logits[0], linear(m.head, h_ab + h_ba))
    loss, parts = m.losses(batch)
    torch.testing.assert_close(parts["task_loss"], (logits[0, 0] - 3.5) ** 2)


def test_multiple_choice_softmax_ignores_masked_choices():
    task = MultipleChoice(name="mc", context=["c"], choices=["a", "b", "d"])
    m = module(task)
    rows = [[START, 1, DELIM, 2, EXTRACT], [START, 1, DELIM, 3, EXTRACT], [START, 1, DELIM, 4, EXTRACT]]
    batch = collate([example(rows, 1), example(rows[:2], 0)], PAD)  # the second row lacks choice 3
    with torch.no_grad():
        m.head.bias.fill_(0.0)
        logits = m(batch)
    scores = torch.stack([linear(m.head, m.gpt(torch.tensor([r]))[0, -1])[0] for r in rows])
    torch.testing.assert_close(logits[0], scores)
    assert logits[1, 2] == torch.finfo(logits.dtype).min
    loss, parts = m.losses(batch)
    expected = (
        F.cross_entropy(scores[None], torch.tensor([1]))
        + F.cross_entropy(scores[None, :2], torch.tensor([0]))
    ) / 2
    torch.testing.assert_close(parts["task_loss"], expected)
    # A masked choice never wins, even with the highest raw score.
    with torch.no_grad():
        m.head.bias.fill_(0.0)
        m.head.weight.copy_(m.gpt(torch.tensor([rows[2]]))[0, -1][None] * 10)
    assert m(batch)[1].argmax().item() in (0, 1)


def test_language_model_without_task():
    m = module(None)
    batch = collate([example([[START, 1, 2, 3]], None)], PAD)
    loss, parts = m.losses(batch)
    assert set(parts) == {"lm_loss"} and set(m.terms(batch)) == {"lm_sum", "lm_count"}
    assert m.head is None and not any(n.startswith("head") for n, _ in m.named_parameters())


def test_init_from_transformers_directory_adds_special_token_rows(tmp_path):
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    torch.manual_seed(0)
    hf = OpenAIGPTLMHeadModel(OpenAIGPTConfig(vocab_size=20, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    hf.save_pretrained(tmp_path)
    m = GPTModule(init_from=str(tmp_path), vocab_size=24, task=SingleText(name="t", labels=["a", "b"]))
    assert m.gpt.wte.weight.shape == (64, 16)  # padded to a multiple of 64
    torch.testing.assert_close(m.gpt.wte.weight[:20], hf.transformer.tokens_embed.weight)
    assert m.gpt.config.vocab_size == 24
    # in training mode, dropout on: Lightning leaves a module's mode as it finds it at fit's start
    assert all(module.training for module in m.modules())


def test_bad_hyperparameters():
    with pytest.raises(ValueError, match="lm_coef must be >= 0, got -1"):
        GPTModule(preset="gpt-micro", lm_coef=-1)
    with pytest.raises(ValueError, match="lr must be > 0, got 0"):
        GPTModule(preset="gpt-micro", lr=0)
    with pytest.raises(ValueError, match="warmup_steps must be >= 0, got -5"):  # it never reached the peak
        GPTModule(preset="gpt-micro", warmup_steps=-5)
    with pytest.raises(ValueError, match=r"weight_decay must be >= 0, got -0.1\."):  # grows weights
        GPTModule(preset="gpt-micro", weight_decay=-0.1)
    with pytest.raises(ValueError, match=r"betas must be two numbers in \[0, 1\), got \[0.9, 1.5\]\."):
        GPTModule(preset="gpt-micro", betas=(0.9, 1.5))
    with pytest.raises(ValueError, match=r"eps must be > 0, got -1e-08\."):
        GPTModule(preset="gpt-micro", eps=-1e-8)
    with pytest.raises(ValueError, match=r"^classifier_dropout must be in \[0, 1\), got 1.5\.$"):  # torch's
        GPTModule(preset="gpt-micro", classifier_dropout=1.5)
    # Names only the command line's parser checked: from Python a misspelt schedule decayed linearly,
    # and any optimizer but "muon" was AdamW
    with pytest.raises(
        ValueError, match=r"^schedule must be one of linear, cosine, constant, got 'cosnie'\.$"
    ):
        GPTModule(preset="gpt-micro", schedule="cosnie")
    with pytest.raises(ValueError, match=r"^optimizer must be one of adamw, muon, got 'Muon'\.$"):
        GPTModule(preset="gpt-micro", optimizer="Muon")
    # ... and new tokens' start, class weights by name, and numbers YAML 1.1 reads as strings (`1e-3`):
    # new tokens started random, no class weighed, and a TypeError deep in the optimizer's checks
    with pytest.raises(ValueError, match=r"^new_tokens must be one of random, copied, mean, got 'copy'\.$"):
        GPTModule(preset="gpt-micro", new_tokens="copy")
    with pytest.raises(
        ValueError, match=r"^class_weights must be a weight per class or 'balanced', got 'bal'"
    ):
        GPTModule(preset="gpt-micro", task=SingleText(name="t", labels=["a", "b"]), class_weights="bal")
    for name in ("lr", "warmup_fraction", "classifier_dropout"):
        with pytest.raises(ValueError, match=rf"^{name} must be a number, got '1e-3'\.$"):
            GPTModule(preset="gpt-micro", **{name: "1e-3"})
    # NaN passed every range check (each comparison false): the weights turned NaN and the first
    # validation's calibration error failed on an index out of range
    for name, value in (
        ("weight_decay", math.nan),
        ("lr", math.inf),
        ("lm_coef", math.nan),
        ("eps", math.nan),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number, got {value}\.$"):
            GPTModule(preset="gpt-micro", **{name: value})
    for name, value in (
        ("classifier_dropout", math.nan),
        ("warmup_fraction", math.nan),
        ("betas", (math.nan, 0.9)),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            GPTModule(preset="gpt-micro", **{name: value})
    with pytest.raises(FileNotFoundError, match="Checkpoint nowhere.ckpt does not exist"):
        GPTModule(init_from="nowhere.ckpt")
    # A misspelt override was an argparse.ArgumentError, which Python callers do not expect
    with pytest.raises(ValueError, match=r"\['n_lyer'\] in the overrides of preset 'gpt-micro': did you"):
        GPTModule(preset="gpt-micro", overrides={"n_lyer": 2})


def test_a_checkpoint_of_another_shape_head_or_kind_is_named_in_one_sentence():
    m = module(SingleText(name="t", labels=["a", "b"]))
    config, head16 = dict(vars(m.gpt.config)), {"head.weight": torch.zeros(2, 16)}
    m.on_load_checkpoint({"gpt_config": config, "state_dict": {"head.weight": torch.zeros(2, 16)}})
    with pytest.raises(
        ValueError,
        match=r"^The checkpoint holds a model with n_layer=2, n_embd=64 but this run builds n_layer=1, "
        r"n_embd=16: ",
    ):
        m.on_load_checkpoint({"gpt_config": {**config, "n_embd": 64, "n_layer": 2}})
    older = {k: v for k, v in config.items() if k != "n_embd"}  # (a field it lacks: its default then)
    with pytest.raises(ValueError, match=r"^The checkpoint holds a model with n_embd=768 but this run "):
        m.on_load_checkpoint({"gpt_config": older})
    m.on_load_checkpoint({"state_dict": {"head.weight": torch.zeros(2, 16)}})  # (no config: none to compare)
    # A model built from other weights: the preset and overrides given are not its fault.
    m.init_from = "other-weights"
    with pytest.raises(
        ValueError, match=r"n_embd=16: give the --model.init_from it was trained from, not other-"
    ):
        m.on_load_checkpoint({"gpt_config": {**config, "n_embd": 64}})
    m.init_from = None
    with pytest.raises(ValueError, match=r"has a task head of 3 outputs but task 't' needs 2"):
        m.on_load_checkpoint({"gpt_config": config, "state_dict": {"head.weight": torch.zeros(3, 16)}})
    # A head of another width or kind, a temperature no score divides by (validate, test, predict):
    # Lightning's page of size mismatches, or cast and used
    with pytest.raises(ValueError) as raised:
        m.on_load_checkpoint({"gpt_config": config, "state_dict": {"head.weight": torch.zeros(2, 3)}})
    assert str(raised.value) == (
        "The checkpoint's tensors do not fit the head of task 't': head.weight has shape [2, 3], the model's "
        "[2, 16]."
    )
    with pytest.raises(ValueError, match=r"^The checkpoint: its tensor head.weight holds bool values, not "):
        m.on_load_checkpoint({"gpt_config": config, "state_dict": {"head.weight": torch.ones(2, 16).bool()}})
    with pytest.raises(ValueError, match=r"^The checkpoint records a temperature of nan, and gpt-ft calib"):
        m.on_load_checkpoint({"gpt_config": config, "state_dict": head16, "temperature": math.nan})
    # A checkpoint of the other kind: a language model's resumed as a task's, and the reverse
    lm_state = {"gpt.wte.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"^The checkpoint is a language model's checkpoint, not a task's: "):
        m.on_load_checkpoint({"gpt_config": config, "state_dict": lm_state})
    m.on_load_checkpoint({"gpt_config": config})  # a sharded checkpoint: its tensors load apart
    lm = module(None)
    lm.on_load_checkpoint({"gpt_config": config, "state_dict": lm_state})
    # (`GPTModule.load_from_checkpoint` of a fine-tuned checkpoint, given no task, says how to read it;
    # Classifier.from_checkpoint only where the checkpoint records its card, which it needs)
    head = {"head.weight": torch.zeros(2, 16)}
    card = {"init_args": {"task": {"class_path": "gpt_ft.adapters.SingleText"}}}
    for recorded, ends in (({}, " (it records none); "), ({DATA: card}, ", or read it with Classifier.")):
        with pytest.raises(
            ValueError, match=r"^The checkpoint is a task.s checkpoint: give its task \(a card\)"
        ) as e:
            lm.on_load_checkpoint({"gpt_config": config, "state_dict": head, **recorded})
        assert "read or resume it" + ends in str(e.value)


def test_a_checkpoint_loads_in_python_without_the_weights_its_run_started_from(tmp_path, finetuned):
    """`GPTModule.load_from_checkpoint` builds the model on the checkpoint's own weights, as `gpt-ft
    validate --ckpt_path` does: the weights its run started from (`init_from`) were read again, and
    once gone (a GGUF file moved) the checkpoint did not load. Its tokenizer is the copy beside it
    (the run's own, by a path relative to where it ran, was read again), and its task may be a card's
    file, as `GPTModule(task=...)` takes (LightningCLI's record of the run checked it as an adapter)."""
    from gpt_ft.adapters.cards import card_key, load_card
    from gpt_ft.weights.checkpoint import Checkpoint

    saved = torch.load(finetuned.ckpt, weights_only=False)
    assert "_instantiator" in saved["hyper_parameters"]  # as every `gpt-ft fit` checkpoint
    saved["hyper_parameters"]["init_from"] = str(tmp_path / "gone" / "base.gguf")
    saved["hyper_parameters"]["tokenizer"] = str(tmp_path / "gone" / "tokenizer")  # (where it ran)
    torch.save(saved, ckpt := tmp_path / "moved.ckpt")
    beside = Checkpoint.read(finetuned.ckpt).tokenizer
    shutil.copytree(beside, tmp_path / beside.name)
    for task in (load_card(finetuned.card), finetuned.card, str(finetuned.card)):
        m = GPTModule.load_from_checkpoint(ckpt, task=task)
        assert card_key(m.task) == card_key(load_card(finetuned.card))
        for name, value in m.state_dict().items():
            assert torch.equal(value, saved["state_dict"][name]), name
    # copied without it: the run's own tokenizer, where it still is (as before the copy was read)
    saved["hyper_parameters"]["tokenizer"] = str(beside)
    (alone := tmp_path / "alone").mkdir()
    torch.save(saved, alone / "last.ckpt")
    assert GPTModule.load_from_checkpoint(alone / "last.ckpt", task=finetuned.card).hparams.tokenizer == str(
        beside
    )


def test_a_module_built_in_python_with_a_tokenizer_fits_its_vocabulary(tokenizer_dir):
    """Without `vocab_size` (the CLI links the data's), the tokenizer's size, special tokens added:
    the preset's was kept, and the first special token's id ran past the table."""
    from gpt_ft.data.tokenizer import load_tokenizer

    m = GPTModule(preset="gpt-micro", task=SingleText(name="t", labels=["a", "b"]), tokenizer=tokenizer_dir)
    assert m.gpt.config.vocab_size == len(load_tokenizer(tokenizer_dir)) == 400


def test_a_module_built_in_python_without_a_tokenizer_keeps_its_presets_vocabulary():
    """Neither `vocab_size` nor `tokenizer` given: the preset's size, or the override's (GPT-1's
    40,478 replaced both)."""
    assert GPTModule(preset="gpt2", overrides={"n_layer": 1}).gpt.config.vocab_size == 50257
    assert GPTModule(preset="gpt-micro", overrides={"vocab_size": 1000}).gpt.config.vocab_size == 1000
    assert GPTModule(preset="gpt-micro", vocab_size=300).gpt.config.vocab_size == 300


def test_the_forward_pass_computes_no_loss(monkeypatch):
    """predict runs `forward`: no task loss, which for embeddings gathers every rank's rows, while a
    predict run's ranks may have unequal numbers of batches (a DDP run waited forever)."""
    from gpt_ft.adapters import Embedding
    from gpt_ft.data.batches import collate_packed

    m = module(Embedding(name="e"))
    monkeypatch.setattr(type(m.head), "losses", lambda *a: pytest.fail("forward computed a loss"))
    ab = [START, 1, 2, EXTRACT]
    for collated in (collate([example([ab, ab], 1.0)], PAD), collate_packed([example([ab, ab], 1.0)], PAD)):
        assert m(collated).shape[0] == 1


def test_a_model_and_data_module_wired_in_python_are_checked_as_the_command_line_checks_them(
    tmp_path, tokenizer_dir
):
    """In a plain `lightning.Trainer`, each in one sentence: a data module's task the model lacks, or
    has as another card of the same name, a model of a task given a language model's tokens, a
    tokenizer larger than the embedding table, sequences longer than the context (an IndexError in
    an embedding, or a model trained without a word). The card's file as the task, and the file to
    the classifier; a trainer reused with other data checks the data of its new call."""
    from lightning import Trainer

    from gpt_ft.data.lm_data import LMDataModule
    from gpt_ft.data.prepare import prepare
    from gpt_ft.data.task_data import TaskDataModule
    from gpt_ft.eval.classifier import Classifier
    from gpt_ft.weights.pretrained import GPT
    from tests.helpers import make_task, write_corpus, write_rows

    card = make_task("single", tmp_path)
    other = tmp_path / "other.yaml"  # task 'sent' too, three labels
    other.write_text(card.read_text().replace("[negative, positive]", "[negative, neutral, positive]"))
    assert other.read_text() != card.read_text()
    data = lambda n: TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), batch_size=2, max_length=n)  # noqa: E731
    prepare(
        out_dir=tmp_path / "tokens",
        tokenizer=tokenizer_dir,
        inputs=[str(write_corpus(tmp_path))],
        progress=False,
    )
    tokens = LMDataModule(str(tmp_path / "tokens"), block_size=16, batch_size=4)
    micro = dict(MICRO, n_positions=64)
    gpt = lambda **kw: GPTModule(preset="gpt-micro", overrides=micro, tokenizer=tokenizer_dir, **kw)  # noqa: E731
    quiet = dict(
        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False
    )
    trainer = lambda: Trainer(max_epochs=1, default_root_dir=tmp_path, accelerator="cpu", **quiet)  # noqa: E731
    for model, datamodule, message in [
        (gpt(), data(64), "reads task 'sent' and the model has no task (a language model): "),
        (gpt(task=str(other)), data(64), "reads task 'sent' and the model has another card of task 'sent'"),
        (gpt(task=str(card)), tokens, "reads a language model's tokens and the model has task 'sent'"),
        (GPTModule(preset="gpt-micro", overrides=micro, vocab_size=300, task=str(card)), data(64),
         "The data module's tokenizer has 400 tokens and the model's embedding table 300 rows: "),
        (gpt(task=str(card)), data(65), "--data.max_length 65 is longer than the model's context of 64"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^(The data module )?{re.escape(message)}"):
            trainer().fit(model, datamodule)
    model, fitted = gpt(task=str(card)), trainer()
    fitted.fit(model, data(64))
    assert model.task.name == "sent" and fitted.global_step == 3
    # the trainer reused on a language model's blocks: its earlier data module (set up again) unread
    (scores,) = fitted.validate(gpt(), dataloaders=tokens.train_dataloader(), verbose=False)
    assert "validation/perplexity" in scores
    ckpt = tmp_path / "m.ckpt"
    fitted.save_checkpoint(ckpt)
    clf = Classifier(
        GPT.from_checkpoint(str(ckpt)), model.head, model.task, tokenizer_dir, max_length=64, device="cpu"
    )
    assert clf.predict([{"sentence": "the cat sat on the mat ."}])[0]["label"] in ("negative", "positive")
    # the card's file as the classifier's task too; a device torch does not know, in one sentence
    by_file = Classifier(GPT.from_checkpoint(str(ckpt)), model.head, str(card), tokenizer_dir, max_length=64,
                         device="cpu")  # fmt: skip
    assert by_file.task.name == "sent"
    with pytest.raises(ValueError, match=r"^device='gpu' is not a device: give cpu, cuda or cuda:N\.$"):
        Classifier(GPT.from_checkpoint(str(ckpt)), model.head, model.task, tokenizer_dir, max_length=64,
                   device="gpu")  # fmt: skip
    # balanced class weights are counted from the data module's training labels under a plain
    # Trainer too (only the command line counted them: the run trained unweighted, without a word)
    rows = [[i, "the cat sat .", int(i < 2)] for i in range(8)]  # 6 negative, 2 positive
    write_rows(tmp_path / "d" / "train.tsv", ["index", "sentence", "label"], rows)
    listed = gpt(task=str(card), class_weights=numpy.array([1.0, 3.0]))  # (an array: no `== "balanced"`)
    trainer().fit(listed, data(64))
    assert listed.head.class_weights.tolist() == [1.0, 3.0]
    weighed = gpt(task=str(card), class_weights="balanced")
    assert weighed.head.class_weights is None  # (no data yet)
    trainer().fit(weighed, data(64))
    assert weighed.head.class_weights.tolist() == pytest.approx([8 / (2 * 6), 8 / (2 * 2)])
    with pytest.raises(
        ValueError, match=r"^class_weights='balanced' counts the training labels of the run's"
    ):
        trainer().fit(
            gpt(task=str(card), class_weights="balanced"), train_dataloaders=data(64).train_dataloader()
        )


def test_a_split_is_computed_on_every_rank_when_any_saw_a_batch(monkeypatch):
    """Computing a split's metrics gathers over the ranks: a rank that saw none of its batches
    computes too where another did (it skipped, and the others waited on it for ever)."""
    from types import SimpleNamespace

    from gpt_ft.training.eval_metrics import split_key

    m = GPTModule(preset="gpt-micro")
    asked, computed = [], []
    for any_rank in (True, False):
        strategy = SimpleNamespace(reduce_boolean_decision=lambda d, all: asked.append((d, all)) or any_rank)
        trainer = SimpleNamespace(
            strategy=strategy, state=SimpleNamespace(fn="validate"), sanity_checking=False
        )
        monkeypatch.setattr(GPTModule, "trainer", property(lambda self: trainer))
        metric = m.metrics[split_key("validation")]
        assert not metric.update_called  # this rank saw no batch
        monkeypatch.setattr(metric, "compute", lambda: computed.append(1) or {})
        m._log_metrics("validation")
    assert asked == [(False, False)] * 2 and computed == [1]  # computed where another rank saw one
