"""Gradient accumulation weighs every example and target token as one batch of them all would:
k micro-batches of b examples give the gradient of one batch of k·b, the auxiliary LM loss
included, though the micro-batches hold different numbers of tokens."""

import warnings

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from gpt_ft.training.runs import lightning_main
from tests.helpers import make_task, write_rows

NO_DROPOUT = (
    "{n_positions: 64, n_embd: 32, n_layer: 1, n_head: 2, embd_pdrop: 0, attn_pdrop: 0, resid_pdrop: 0}"
)


class FirstGradients(Callback):
    """Every parameter's gradient at the first optimizer step."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.grads:
            self.grads = {n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None}


def first_gradients(card, tokenizer_dir, root, batch: int, accumulate: int, *extra: str) -> dict:
    grads = FirstGradients()
    args = [
        f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}", f"--data.data_dir={card.parent}",
        f"--data.batch_size={batch}", "--data.max_length=64", "--model.preset=gpt-micro",
        f"--model.overrides={NO_DROPOUT}", "--model.classifier_dropout=0", "--model.lm_coef=0.5",
        "--trainer.max_steps=1", f"--trainer.accumulate_grad_batches={accumulate}", "--seed_everything=0",
        f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.limit_val_batches=0", *extra,
    ]  # fmt: skip
    lightning_main(["fit", *args], callbacks=[grads])
    return grads.grads


@pytest.mark.parametrize(("kind", "packing"), [("pair", "true"), ("choice", "false")])
def test_three_micro_batches_give_the_gradient_of_one_batch_of_them_all(
    tmp_path, tokenizer_dir, kind, packing
):
    card = make_task(kind, tmp_path / "task")
    # Texts of different lengths: the micro-batches' token counts differ.
    words = "a b c d e f g h i j k l m n o p q".split()
    if kind == "pair":
        rows = [
            [i, " ".join(words[: 2 + 3 * i]), "the cat .", ["not_entailment", "entailment"][i % 2]]
            for i in range(6)
        ]
        write_rows(card.parent / "d" / "train.tsv", ["index", "sentence1", "sentence2", "label"], rows)
    else:
        rows = [[" ".join(words[: 1 + 3 * i]), "He is happy.", "He ran.", 1 + i % 2] for i in range(6)]
        write_rows(card.parent / "d" / "train.csv", ["story", "end1", "end2", "label"], rows)
    whole = first_gradients(card, tokenizer_dir, tmp_path / "whole", 6, 1, f"--data.packing={packing}")
    accumulated = first_gradients(card, tokenizer_dir, tmp_path / "acc", 2, 3, f"--data.packing={packing}")
    assert whole.keys() == accumulated.keys() and whole
    for name, grad in whole.items():
        torch.testing.assert_close(accumulated[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("kind", ["pair", "choice"])
def test_the_windows_counts_are_those_of_the_batches_the_loader_gives(tmp_path, tokenizer_dir, kind):
    """Counted ahead from the sampler's order, as the collators count them (a shared context's
    tokens once per choice), an epoch's shorter last window and a limited epoch's too."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule
    from tests.helpers import trainer_on

    card = make_task(kind, tmp_path)
    data = TaskDataModule(load_card(card), tokenizer_dir, data_dir=str(tmp_path), batch_size=2, seed=3)
    data.setup("fit")
    data.trainer = trainer_on("cpu")
    counts, loader = [], data.train_dataloader()
    for batch in loader:
        weights = batch.lm_weights if batch.lm_weights is not None else torch.ones_like(batch.lm_targets)
        counts.append((len(batch), int(weights.sum())))
    assert len(counts) == 3
    for k, batches, windows in ((2, 3, [[0, 1], [2]]), (3, 3, [[0, 1, 2]]), (2, 2, [[0, 1]])):
        for window in windows:
            expected = tuple(sum(counts[i][j] for i in window) for j in (0, 1))
            found = [data.window_counts(i, k, batches, loader.sampler) for i in window]
            assert found == [expected] * len(window), (k, batches, window)
    # A loader whose sampler is another's (`--trainer.overfit_batches` puts a sequential one in)
    assert data.window_counts(0, 2, 3, torch.utils.data.SequentialSampler(range(6))) is None


def test_the_window_divides_the_loss_and_the_logged_parts_stay_the_batchs_own():
    """Hand-computed: task sums 4 over 2 examples, LM sums 6 over 8 targets; a window of 2 batches
    with 6 examples and 10 targets. In bf16-true's default dtype too (counts stay fp32)."""
    from gpt_ft.training.module import normalised

    terms = {
        "lm_sum": torch.tensor([2.0, 4.0]),
        "lm_count": torch.tensor([3, 5]),
        "task_loss": torch.tensor([1.0, 3.0]),
    }
    loss, parts = normalised(terms, 1, None, 0.5)
    assert (float(loss), float(parts["task_loss"]), float(parts["lm_loss"])) == (2.375, 2.0, 0.75)
    loss, parts = normalised(terms, 1, (2, 6, 10), 0.5)
    assert float(loss) == pytest.approx(4 / 3 + 0.5 * 6 / 5)  # what the gradient follows
    assert (float(parts["loss"]), float(parts["task_loss"]), float(parts["lm_loss"])) == (2.375, 2.0, 0.75)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)
        big = {"lm_sum": torch.tensor([8800.0], dtype=torch.float32), "lm_count": torch.tensor([4939])}
        loss, _ = normalised(big, 1, (1, 0, 4939), 0.5)
    finally:
        torch.set_default_dtype(default)
    assert float(loss) == pytest.approx(8800 / 4939, rel=1e-6)  # the LM loss alone: pretraining
    # A batch (or window) with no LM target: its LM loss is 0 (a sum over none), not 0/0's NaN.
    none = {
        "lm_sum": torch.zeros(2),
        "lm_count": torch.zeros(2, dtype=torch.long),
        "task_loss": terms["task_loss"],
    }
    for window in (None, (1, 2, 0)):
        loss, parts = normalised(none, 1, window, 0.5)
        assert (float(loss), float(parts["lm_loss"]), float(parts["task_loss"])) == (2.0, 0.0, 2.0)


def test_pretrainings_last_window_of_an_epoch_weighs_its_blocks_as_one_batch(tmp_path, tokenizer_dir):
    """An epoch of 82 blocks in micro-batches of 4, 2 a step: its last window holds one short batch
    (2 blocks), whose gradient was divided by the window's length as if it held 8. Every step's
    gradient equals that of one batch of the window's blocks (the learning rate is ~0)."""
    from gpt_ft.cli import main
    from gpt_ft.data.lm_data import TokenBlocks
    from tests.helpers import write_corpus

    corpus, tokens = write_corpus(tmp_path, n_files=1, lines=60), tmp_path / "tokens"
    main(["prepare", f"--inputs={corpus}", f"--tokenizer={tokenizer_dir}", f"--out_dir={tokens}"]
         + ["--validation_fraction=0", "--progress=false"])  # fmt: skip
    blocks = len(TokenBlocks(tokens / "train.bin", "uint16", 7))

    def gradients(batch: int, accumulate: int) -> list[torch.Tensor]:
        seen = []

        class Every(Callback):
            def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
                seen.append(pl_module.gpt.h[0].attn.c_attn.weight.grad.clone())

        logs = tmp_path / str(batch)
        args = ["--data=gpt_ft.data.lm_data.LMDataModule", f"--data.token_dir={tokens}",
                "--data.block_size=7", f"--data.batch_size={batch}", "--data.shuffle=false",
                "--model.preset=gpt-micro", f"--model.overrides={NO_DROPOUT}",
                "--model.lr=1e-30", "--model.weight_decay=0",
                "--trainer.max_epochs=1", f"--trainer.accumulate_grad_batches={accumulate}",
                "--trainer.limit_val_batches=0", f"--trainer.logger.init_args.save_dir={logs}",
                "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]  # fmt: skip
        lightning_main(["fit", *args, "--seed_everything=0"], callbacks=[Every()])
        return seen

    whole, accumulated = gradients(8, 1), gradients(4, 2)
    assert blocks == 82 and len(whole) == len(accumulated) == 11
    for step, (a, b) in enumerate(zip(accumulated, whole)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8, msg=f"step {step}")


@pytest.mark.parametrize(("then", "now"), [((1, 4), (2, 2)), ((1, 3), (1, 2))])
def test_a_resumed_epochs_windows_count_the_batches_it_gives(tmp_path, tokenizer_dir, then, now):
    """Resumed 1 batch into epoch 1 on another number of processes (the same examples a step) or
    with another batch size: the loader deals out what the checkpoint's run left, and each window
    counts those batches (it counted the epoch's order from its start: other examples, other tokens)."""
    from types import SimpleNamespace

    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule

    card = make_task("pair", tmp_path)
    words = "a b c d e f g h i j k l m n o p q r s t".split()
    rows = [[i, " ".join(words[: 1 + (7 * i) % 19]), "the cat .", ["entailment", "not_entailment"][i % 2]]
            for i in range(13)]  # fmt: skip
    write_rows(card.parent / "d" / "train.tsv", ["index", "sentence1", "sentence2", "label"], rows)
    (world_then, size_then), (world, size) = then, now
    for rank in range(world):
        data = TaskDataModule(load_card(card), tokenizer_dir, data_dir=str(tmp_path), batch_size=size, seed=5)
        data.setup("fit")
        data.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")),
                                       world_size=world, global_rank=rank)  # fmt: skip
        state = {
            "epoch": 1,
            "batches": 1,
            "batch_size": size_then,
            "world": world_then,
            "seed": 5,
            "size": 13,
        }
        data.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (another step size is warned about)
            loader = data.train_dataloader()
        given = []
        for batch in loader:
            weights = batch.lm_weights if batch.lm_weights is not None else torch.ones_like(batch.lm_targets)
            given.append((len(batch), int(weights.sum())))
        assert sum(n for n, _ in given) == len(loader.sampler) - 1 * size_then * world_then // world
        counted = [data.window_counts(1 + j, 1, len(loader), loader.sampler) for j in range(len(given))]
        assert counted == given, (rank, counted, given)
