"""DDP on CPU (gloo, 2 processes) through the CLI: same weights and exact metrics as one process.

The 2-process runs are `python -m gpt_ft ... --trainer.strategy=ddp` in processes of their own (run in
the background from the start of the session, tests/background.py); the 1-process reference runs go
through `gpt_ft.cli.main` in this process."""

import csv
import errno
import json
from pathlib import Path

import pytest
import torch

from gpt_ft.cli import main
from tests.background import gpt_ft
from tests.helpers import (
    ROOT,
    common_args,
    make_task,
    sentence,
    write_rankings,
    write_solutions,
    write_varied_pairs,
)

NO_DROPOUT = "embd_pdrop: 0.0, attn_pdrop: 0.0, resid_pdrop: 0.0"
MICRO = f"{{n_positions: 64, n_embd: 32, n_layer: 2, n_head: 2, {NO_DROPOUT}}}"


def ddp_args(devices: int) -> list[str]:
    if devices == 1:
        return ["--trainer.accelerator=cpu", "--trainer.devices=1"]
    return ["--trainer.accelerator=cpu", f"--trainer.devices={devices}", "--trainer.strategy=ddp"]


def run_dir(root: Path) -> Path:
    versions = list((root / "runs" / "lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0"]  # one logger: only rank 0 writes
    return versions[0]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def validation_rows(run: Path, kind: str = "validation") -> list[dict[str, float]]:
    """The rows of a run's metrics.csv that hold `kind`/loss, with its `kind`/ values."""
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get(f"{kind}/loss")]
    return [{k: float(v) for k, v in r.items() if k.startswith(f"{kind}/") and v} for r in rows]


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= atol, f"max abs difference {worst}"


def finetune_runs(
    card: Path, tokenizer_dir: str, root: Path, devices: int, batch: int, precision: str = "32-true",
    accumulate: int = 1,
) -> list[list[str]]:  # fmt: skip
    """`fit` and `predict` arguments of the fine-tuning run on `devices` processes, into root/x{devices}."""
    out = root / f"x{devices}"
    common = [
        f"--data.task={card}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={root}",
        "--data.eval_batch_size=2",  # 5 test examples: 2 batches on rank 0, 1 on rank 1
        "--data.max_length=32",
        "--model.preset=gpt-micro",
        f"--model.overrides={MICRO}",
        "--model.classifier_dropout=0.0",
        f"--model.predictions_dir={out / 'pred'}",
        f"--trainer.logger.init_args.save_dir={out / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *ddp_args(devices),
    ]
    fit = [
        "--config",
        str(ROOT / "configs/finetune/gpt1.yaml"),
        f"--data.batch_size={batch}",
        "--data.shuffle=false",
        "--model.lr=1e-3",
        "--trainer.max_epochs=3",
        f"--trainer.precision={precision}",
        f"--trainer.accumulate_grad_batches={accumulate}",
        "--trainer.log_every_n_steps=1",  # every step's training losses in metrics.csv
    ]
    last = out / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    return [["fit", *fit, *common], ["predict", *common, f"--ckpt_path={last}"]]


def start_ddp_finetuning(root, tokenizer_dir):
    card = write_varied_pairs(root)
    # 2 processes x 2 micro-batches of 2: a step of 8 examples, as one process's batch of 8
    fit, predict = finetune_runs(card, tokenizer_dir, root, devices=2, batch=2, accumulate=2)
    logs = root / "x2" / "runs" / "lightning_logs"
    # The version folders after fit (predict, with the same logger, adds its own).
    return [
        gpt_ft(*fit, cwd=root, after=lambda: sorted(v.name for v in logs.iterdir())),
        gpt_ft(*predict, cwd=root),
    ]


@pytest.mark.background(start=start_ddp_finetuning)
def test_finetuning_on_two_processes_accumulating_equals_one_with_the_whole_batch(
    background, tokenizer_dir, monkeypatch
):
    root = background.root
    fit2, predict2 = background.runs  # on 2 processes
    assert fit2.returncode == 0, fit2.stderr[-3000:]
    assert "sync_dist=True" not in fit2.stderr  # the metrics are gathered before they are logged
    assert fit2.after == ["version_0"]  # one logger: only rank 0 writes
    assert predict2.returncode == 0, predict2.stderr[-3000:]
    monkeypatch.chdir(root)
    fit1, predict1 = finetune_runs(root / "pair.yaml", tokenizer_dir, root, devices=1, batch=8)
    main(fit1)
    runs = {2: root / "x2" / "runs" / "lightning_logs" / "version_0", 1: run_dir(root / "x1")}
    main(predict1)
    for devices, run in runs.items():
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert ckpt["global_step"] == 6
    predictions2, predictions1 = ((root / f"x{d}" / "pred" / "pair-test.tsv").read_text() for d in (2, 1))
    two, one = runs[2], runs[1]
    assert_same_weights(weights(two), weights(one))
    # Validation on 7 examples: rank 1's repeated example is dropped, so every figure is the same.
    rows2, rows1 = validation_rows(two), validation_rows(one)
    assert len(rows1) == 3 and rows2[0].keys() == rows1[0].keys() >= {
        "validation/loss",
        "validation/accuracy",
    }
    for a, b in zip(rows2, rows1):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)
    # One predictions file with every test example once, in order, as from one process; a split of
    # one example, fewer than the ranks, too (a rank without any crashed).
    assert predictions2 == predictions1 and len(predictions1.splitlines()) == 6
    one2, one1 = ((root / f"x{d}" / "pred" / "pair-one.tsv").read_text().splitlines() for d in (2, 1))
    assert one2 == one1 and len(one1) == 2


CARDS = {
    "steps": (write_solutions, "gpt_ft.adapters.Steps", "label_form: first_error, max_steps: 4, index: id"),
    "ranking": (write_rankings, "gpt_ft.adapters.Ranking", "max_replies: 4, index: null"),
}


# A ranking's loss is blind to a common shift of a list's rewards, so some gradients are zero but for
# fp32 rounding, which Adam scales up to steps of the learning rate: rankings compare in fp64.
PRECISION = {"ranking": "64-true", "steps": "32-true"}


def start_ddp_task(shape: str):
    """The background start of a 2-process fit of the `shape` card on 16/7/5 generated examples."""

    def start(root, tokenizer_dir):
        write, class_path, fields = CARDS[shape]
        for split, n, seed in (("train", 16, 1), ("validation", 7, 2), ("test", 5, 3)):
            write(root / f"{split}.jsonl", n, seed)
        splits = "{train: train.jsonl, validation: validation.jsonl, test: test.jsonl}"
        card = f"class_path: {class_path}\ninit_args: {{name: pair, {fields}, local: {{splits: {splits}}}}}\n"
        (root / f"{shape}.yaml").write_text(card)
        fit, _ = finetune_runs(root / f"{shape}.yaml", tokenizer_dir, root, 2, 4, PRECISION.get(shape))
        return [gpt_ft(*fit, cwd=root)]

    start.__name__ = f"start_ddp_{shape}"  # its folder's name
    return start


def fit_on_one_process(background, shape: str, tokenizer_dir: str) -> tuple[Path, Path]:
    """After the 2-process fit of `shape`, the same on one process: both runs' folders."""
    root = background.root
    (fit2,) = background.runs
    assert fit2.returncode == 0, fit2.stderr[-3000:]
    fit1, _ = finetune_runs(root / f"{shape}.yaml", tokenizer_dir, root, 1, 8, PRECISION.get(shape))
    main(fit1)
    return root / "x2" / "runs" / "lightning_logs" / "version_0", run_dir(root / "x1")


@pytest.mark.background(start=start_ddp_task("steps"))
def test_step_rewards_on_two_processes_equal_one(background, tokenizer_dir, monkeypatch):
    """A verdict per step: the same weights, every step metric, and the threshold each validation
    chooses from all ranks' solutions (7: one repeated on rank 1, dropped) kept in the head."""
    monkeypatch.chdir(background.root)
    two, one = fit_on_one_process(background, "steps", tokenizer_dir)
    assert_same_weights(weights(two), weights(one))
    assert "head.threshold" in weights(one)
    rows2, rows1 = validation_rows(two), validation_rows(one)
    assert len(rows1) == 3 and "validation/threshold" in rows1[0] and "validation/processbench_f1" in rows1[0]
    for a, b in zip(rows2, rows1):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)
    # The training losses logged: the global batch's (rank 0's share of it before), as one process logs.
    train2, train1 = validation_rows(two, "train"), validation_rows(one, "train")
    assert len(train1) == 6 and train2[0].keys() == train1[0].keys() >= {"train/loss", "train/task_loss"}
    for a, b in zip(train2, train1, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert float(weights(one)["head.threshold"]) == pytest.approx(rows1[-1]["validation/threshold"])


@pytest.mark.background(start=start_ddp_task("ranking"))
def test_rankings_on_two_processes_equal_one(background, tokenizer_dir, monkeypatch):
    """Lists of 2-4 replies, the prompt shared where that pays: the same weights and the same
    best-of-N, pairwise accuracy and Kendall's tau over all ranks' lists (7: one repeated on rank 1,
    dropped)."""
    monkeypatch.chdir(background.root)
    two, one = fit_on_one_process(background, "ranking", tokenizer_dir)  # in fp64 (`PRECISION`)
    assert_same_weights(weights(two), weights(one), atol=1e-9)
    rows2, rows1 = validation_rows(two), validation_rows(one)
    assert len(rows1) == 3 and {"validation/best_of_n", "validation/kendall_tau"} <= rows1[0].keys()
    for a, b in zip(rows2, rows1):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)


def pretraining_run(tokens: Path, root: Path, devices: int, batch: int, compile: str) -> list[str]:
    n_validation = json.loads((tokens / "meta.json").read_text())["tokens"]["validation"]
    # An odd number of validation blocks, so that one rank repeats one.
    block = next(b for b in range(16, 8, -1) if (n_validation - 1) // b % 2)
    return [
        "fit",
        "--config",
        str(ROOT / "configs/pretrain/cpu.yaml"),
        f"--data.token_dir={tokens}",
        f"--data.block_size={block}",
        f"--data.batch_size={batch}",
        "--data.eval_batch_size=2",
        "--data.shuffle=false",
        "--model.preset=gpt-micro",
        f"--model.overrides={MICRO}",
        f"--model.compile={compile}",  # the compiled model must train exactly like the eager one
        "--trainer.precision=32-true",  # exact sums: not the recipe's bf16, where the CPU keeps it
        "--model.warmup_steps=1",
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        f"--trainer.logger.init_args.save_dir={root / f'x{devices}' / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *ddp_args(devices),
    ]


def start_ddp_pretraining(root, tokenizer_dir):
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(sentence(i + j) for j in range(20)) for i in range(12)) + "\n")
    main(["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir, "--out_dir", str(root / "tokens"),
          "--validation_fraction", "0.3", "--split_on", "blank_line"])  # fmt: skip
    # The bar rank 0 alone shows, every 10 batches (tqdm's refresh rate here), on steps no logger
    # writes: a step's values averaged over the ranks there waited forever for the other ranks.
    bar = ["--trainer.enable_progress_bar=true", "--trainer.log_every_n_steps=50", "--trainer.max_steps=12",
           "--trainer.val_check_interval=1000"]  # fmt: skip
    return [
        gpt_ft(*pretraining_run(root / "tokens", root, devices=2, batch=2, compile="aot_eager"), cwd=root),
        gpt_ft(*pretraining_run(root / "tokens", root / "bar", 2, batch=2, compile="false"), *bar, cwd=root),
    ]


@pytest.mark.background(start=start_ddp_pretraining)
def test_pretraining_on_two_processes_equals_one_with_the_double_batch(background, monkeypatch):
    root = background.root
    done, shown = background.runs  # on 2 processes, compiled; then eager with the progress bar
    assert done.returncode == 0, done.stderr[-3000:]
    assert shown.returncode == 0 and "12/12" in shown.stdout, shown.stderr[-3000:]  # the bar: stdout
    assert "sync_dist=True" not in done.stderr  # the losses are gathered before they are logged
    monkeypatch.chdir(root)
    main(pretraining_run(root / "tokens", root, devices=1, batch=4, compile="false"))
    runs = {devices: run_dir(root / f"x{devices}") for devices in (2, 1)}
    assert_same_weights(weights(runs[2]), weights(runs[1]))
    rows2, rows1 = validation_rows(runs[2]), validation_rows(runs[1])
    assert len(rows1) == 2 and set(rows1[0]) == {"validation/loss", "validation/perplexity"}
    for a, b in zip(rows2, rows1):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)


def start_ddp_without_its_data(root, tokenizer_dir):
    card = make_task("single", root)
    (root / "d" / "train.tsv").unlink()
    labels = root / "labels"  # a label outside the card's, found as each process encodes the data
    card_of_labels = make_task("single", labels)
    train = labels / "d" / "train.tsv"
    train.write_text(train.read_text().replace("\t1\n", "\tmaybe\n", 1))
    restored = root / "restored"  # (its data whole)
    card_whole = make_task("single", restored)
    return [
        gpt_ft("fit", *common_args(card, tokenizer_dir, root), *ddp_args(2), cwd=root),
        gpt_ft("fit", *common_args(card_of_labels, tokenizer_dir, labels), *ddp_args(2), cwd=labels),
        gpt_ft(
            "fit",
            *common_args(card_whole, tokenizer_dir, restored),
            *ddp_args(2),
            "--ckpt_path=nothere.ckpt",
            cwd=restored,
        ),  # fmt: skip
    ]


@pytest.mark.background(start=start_ddp_without_its_data)
def test_a_fault_in_the_data_of_a_run_on_two_processes_is_said_once(background):
    """The data is read before the other process starts: the fault is said once, by the first
    process; a fault found as each process encodes the data (a label outside the card's) once too
    (each process said it), and so is a checkpoint to resume that is missing, now found before the
    other process starts (Lightning found it once both ran, and each said it)."""
    fit, labels, restored = background.runs
    for run in background.runs:
        assert run.returncode == 2, run.stderr[-3000:]
    said = [line for line in fit.stderr.splitlines() if line.startswith("gpt-ft: error:")]
    missing = background.root / "d" / "train.tsv"
    assert said == [f"gpt-ft: error: {missing}: file not found (split 'train' of task 'sent')."], said
    said = [line for line in labels.stderr.splitlines() if line.startswith("gpt-ft: error:")]
    assert len(said) == 1 and "line 3: label 'maybe' in field 'label' is not among the labels" in said[0], (
        said
    )
    said = [line for line in restored.stderr.splitlines() if line.startswith("gpt-ft: error:")]
    assert said == ["gpt-ft: error: --ckpt_path nothere.ckpt does not exist."], restored.stderr[-3000:]
    assert "GLOBAL_RANK" not in restored.stderr  # (no process started)


def test_the_first_process_of_a_run_is_known_by_its_group_where_it_joined_one(monkeypatch):
    """A fault every process meets alike (`gpt_ft.cli.main.ALIKE`) is said by the group's first process;
    a process in no group is first whatever its environment holds (`srun`'s second task of a command
    run alone printed nothing, exit 2, for `LOCAL_RANK` or `SLURM_LOCALID` 1)."""
    import torch.distributed as dist

    from gpt_ft.data.folders import first_process

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert not first_process() and first_process(of_its_group=True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    assert not first_process(of_its_group=True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    assert first_process(of_its_group=True)


def test_a_fault_of_one_process_alone_is_said_by_it(monkeypatch, capsys, tmp_path):
    """Only what every process meets alike is left to the first to say: a fault of one rank's own
    (its shard's) was lost, the first saying only that it lost another process. A checkpoint that
    does not fit the run (another run's optimizer, no checkpoint at all) is read alike by every
    process: each said it; a fault of one process's read of it (memory, I/O) is that process's own."""
    import importlib

    import torch.distributed as dist

    from gpt_ft.errors import TaskDataError, os_error_message
    from gpt_ft.training.optim import check_same_optimizer
    from gpt_ft.weights.checkpoint import safe_load

    def fault_of(check, *args):
        with pytest.raises((ValueError, OSError)) as raised:
            check(*args)
        return raised.value

    (tmp_path / "notes.ckpt").write_text("not a checkpoint\n")

    def unread(path):  # a fault of this process's read, not of the file: said by the process
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    muon = {"optimizer_states": [{"muon": {}, "state": {}}]}
    cli = importlib.import_module("gpt_ft.cli.main")  # (the module: the package's `main` is its function)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    for fault, said in ((ValueError("example 17 of this rank's shard is malformed."), True),
                        (TaskDataError("d/train.tsv: file not found."), False),
                        (FloatingPointError("The training loss became nan at step 3."), False),
                        (fault_of(check_same_optimizer, muon, "adamw", "last.ckpt"), False),
                        (fault_of(safe_load, tmp_path / "notes.ckpt"), False),
                        (fault_of(safe_load, tmp_path), False),
                        (fault_of(safe_load, tmp_path / "notes.ckpt", unread), True)):  # fmt: skip

        def run(name, args, fault=fault):
            raise fault

        monkeypatch.setitem(cli.COMMANDS, "fit", cli.COMMANDS["fit"]._replace(run=run))
        with pytest.raises(SystemExit) as stopped:
            cli.main(["fit"])
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        sentence = os_error_message(fault) if isinstance(fault, OSError) else fault  # (the file, why)
        assert (f"gpt-ft: error: {sentence}" in err) == said, (fault, err)
    assert "notes.ckpt: DefaultCPUAllocator: can't allocate memory." in err  # the last: not "corrupt"
    memory = fault_of(safe_load, tmp_path / "notes.ckpt", unread)  # from Python: a number, not "[Errno None]"
    assert memory.errno == errno.ENOMEM and str(memory).startswith("[Errno 12] DefaultCPUAllocator")
