import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from gpt_ft.cli import main
from gpt_ft.data.lm_data import LMDataModule, TokenBlocks
from gpt_ft.data.prepare import is_validation, pieces, prepare, read_meta
from gpt_ft.data.tokenizer import EOS_TOKEN, load_tokenizer

SENTENCES = [
    "The cat sat on the mat.",
    "A man is playing a guitar.",
    "Two dogs run in a park.",
    "She decides to bake a batch of brownies for the party.",
    "He is happy now.",
]
MICRO = (
    "{n_positions: 64, n_embd: 32, n_layer: 2, n_head: 2, embd_pdrop: 0.0, attn_pdrop: 0.0, resid_pdrop: 0.0}"
)


def write_corpus(root: Path, n_files: int = 4, lines: int = 30) -> Path:
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(n_files):
        text = "\n".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(lines)) + "\n"
        (corpus / f"book{i}.txt").write_text(text)
    return corpus


def test_token_file_holds_exactly_the_documents_and_separators(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path)
    (corpus / "empty.txt").write_text("\n\n")  # a document with no text gets no separator
    meta = prepare(
        tmp_path / "tokens", tokenizer_dir, files=[str(corpus)], validation_fraction=0.0, progress=False
    )
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    expected = []
    for path in sorted(p for p in corpus.iterdir() if p.read_text().strip()):
        expected += tok(path.read_text(), add_special_tokens=False)["input_ids"] + [eos]
    tokens = np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"])
    assert tokens.tolist() == expected
    assert meta["dtype"] == "uint16" and meta["documents"] == 4 and meta["eos_token_id"] == eos
    assert meta["tokens"] == {"train": len(expected), "validation": 0}
    assert read_meta(tmp_path / "tokens")["vocab_size"] == len(tok)


def test_pieces_cut_where_the_tokenizer_splits_so_tokens_are_exact(tmp_path, tokenizer_dir):
    # Runs of blank lines, indented and trailing spaces, and one long line with no line break:
    # cut into ~40-character pieces, the token file still equals the whole document's tokens.
    text = (
        "The cat sat on the mat.\n\n\nA man is  playing a guitar.  \n    Two dogs run.\n"
        + " ".join(SENTENCES * 6)
        + "\n\nHe is happy now.\n \nShe decides to bake a batch of brownies for the party.\n"
    ) * 3
    (tmp_path / "doc.txt").write_text(text)
    meta = prepare(
        tmp_path / "tokens",
        tokenizer_dir,
        files=[str(tmp_path / "doc.txt")],
        piece_chars=40,
        validation_fraction=0.0,
        progress=False,
    )
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    expected = tok(text, add_special_tokens=False)["input_ids"] + [meta["eos_token_id"]]
    assert np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist() == expected
    pieces_made = list(pieces(iter([text]), 40))
    assert len(pieces_made) > len(text) // 40 and "".join(p.text for p in pieces_made) == text


def test_parallel_pieces_and_validation_split(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path, n_files=3, lines=200)
    one = prepare(
        tmp_path / "one",
        tokenizer_dir,
        files=[str(corpus)],
        piece_chars=500,
        validation_fraction=0.3,
        workers=1,
        progress=False,
    )
    two = prepare(
        tmp_path / "two",
        tokenizer_dir,
        files=[str(corpus)],
        piece_chars=500,
        validation_fraction=0.3,
        workers=2,
        progress=False,
    )
    for split in ("train", "validation"):
        name = f"{split}.bin"
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert one["tokens"] == two["tokens"] and one["tokens"]["validation"] > 0 and one["documents"] == 3
    assert sum(is_validation(i, 0.3) for i in range(10_000)) == pytest.approx(3000, abs=150)


def test_sampler_ranks_read_disjoint_blocks_covering_the_epoch(tmp_path):
    path = tmp_path / "t.bin"
    np.arange(8 * 10 + 1, dtype=np.uint16).tofile(path)
    blocks = TokenBlocks(path, "uint16", block_size=8)
    assert len(blocks) == 10
    i, tokens = blocks[3]
    assert i == 3 and tokens.tolist() == list(range(24, 33))  # block_size + 1 tokens: inputs and targets
    for epoch in (0, 1):
        seen = []
        for rank in (0, 1):
            sampler = DistributedSampler(
                blocks, num_replicas=2, rank=rank, shuffle=True, seed=0, drop_last=True
            )
            sampler.set_epoch(epoch)
            seen.append(list(sampler))
        assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(10))
    orders = []
    for epoch in (0, 1):
        sampler = DistributedSampler(blocks, num_replicas=1, rank=0, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders[0] != orders[1]  # a fresh permutation every epoch


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpt_ft", *args], capture_output=True, text=True, cwd=cwd)


def test_pretrain_then_finetune_with_only_the_checkpoint_then_generate(tmp_path, tokenizer_dir, capsys):
    corpus = write_corpus(tmp_path, n_files=6, lines=60)
    out = run(
        "prepare",
        str(corpus),
        "--tokenizer",
        tokenizer_dir,
        "--out_dir",
        str(tmp_path / "tokens"),
        "--validation_fraction",
        "0.2",
        "--piece_chars",
        "400",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "train and" in out.stdout and "tokens/s" in out.stdout
    logs = tmp_path / "runs"
    main(
        [
            "fit",
            "--config",
            "configs/pretrain/cpu.yaml",
            f"--data.token_dir={tmp_path / 'tokens'}",
            "--data.block_size=32",
            "--data.batch_size=8",
            f"--model.overrides={MICRO}",
            "--trainer.max_steps=60",
            "--trainer.val_check_interval=20",
            "--model.warmup_steps=5",
            f"--trainer.logger.init_args.save_dir={logs}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch ")]
    losses = [float(ln.split("validation/loss ")[1].split(",")[0].split(" ")[0]) for ln in lines]
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.5, lines
    ckpt = next(logs.rglob("last.ckpt"))
    assert "perf/tokens_per_s" in next(logs.rglob("metrics.csv")).read_text().splitlines()[0]
    assert (ckpt.parent / "tokenizer" / "tokenizer.json").is_file()
    assert torch.load(ckpt, weights_only=True)["tokenizer"] == "tokenizer"

    # Fine-tune from the checkpoint alone: model shape and tokenizer come with it.
    data = tmp_path / "d"
    data.mkdir()
    (data / "train.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES))
    )
    (data / "dev.tsv").write_text("sentence\tlabel\nThe cat sat on the mat.\t0\n")
    card = tmp_path / "card.yaml"
    card.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: s\n  labels: [a, b]\n"
        "  local: {splits: {train: d/train.tsv, validation: d/dev.tsv}}\n"
    )
    main(
        [
            "fit",
            f"--model.init_from={ckpt}",
            f"--data.task={card}",
            f"--data.data_dir={tmp_path}",
            "--data.max_length=32",
            "--trainer.max_epochs=1",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'ft'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    assert "validation/accuracy" in capsys.readouterr().out
    finetuned = next((tmp_path / "ft").rglob("last.ckpt"))
    pre, post = (torch.load(p, weights_only=True)["state_dict"]["gpt.wpe.weight"] for p in (ckpt, finetuned))
    assert pre.shape == post.shape == (64, 32)

    for weights in (ckpt, finetuned):
        out = run("generate", "--ckpt_path", str(weights), "--prompt", "The cat", "--max_new_tokens", "12")
        assert out.returncode == 0, out.stderr[-2000:]
        # A continuation follows the prompt (a micro model may well continue with newlines).
        assert out.stdout.startswith("The cat") and len(out.stdout) > len("The cat\n")
    beam = run(
        "generate",
        "--ckpt_path",
        str(ckpt),
        "--prompt",
        "The cat",
        "--max_new_tokens",
        "8",
        "--num_beams",
        "3",
    )
    sampled = run(
        "generate",
        "--ckpt_path",
        str(ckpt),
        "--prompt",
        "The cat",
        "--max_new_tokens",
        "8",
        "--do_sample",
        "true",
        "--top_k",
        "5",
        "--temperature",
        "0.8",
    )
    assert beam.returncode == 0 and sampled.returncode == 0, beam.stderr[-1000:] + sampled.stderr[-1000:]


def test_tokenizer_command(tmp_path):
    corpus = write_corpus(tmp_path)
    out = run("tokenizer", str(corpus), "--vocab_size", "300", "--out_dir", str(tmp_path / "tok"))
    assert out.returncode == 0, out.stderr[-2000:]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert len(tok) == 300 and tok.convert_tokens_to_ids("<|extract|>") == 3


def last_error(out) -> str:
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    return out.stderr.strip().splitlines()[-1]


def test_bad_pretraining_input(tmp_path, tokenizer_dir):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("  \n")
    out = run(
        "prepare", str(tmp_path / "empty"), "--tokenizer", tokenizer_dir, "--out_dir", str(tmp_path / "t0")
    )
    assert "holds no text" in last_error(out)
    assert not (tmp_path / "t0" / "train.bin").exists()

    corpus = write_corpus(tmp_path, n_files=1, lines=10)
    assert prepare(
        tmp_path / "tokens", tokenizer_dir, files=[str(corpus)], validation_fraction=0, progress=False
    )
    meta_path = tmp_path / "tokens" / "meta.json"
    meta = json.loads(meta_path.read_text())
    n = meta["tokens"]["train"]
    with pytest.raises(ValueError, match="fewer than one block"):
        LMDataModule(str(tmp_path / "tokens"), block_size=n)
    out = run(
        "fit",
        "--config",
        "configs/pretrain/cpu.yaml",
        f"--data.token_dir={tmp_path / 'tokens'}",
        f"--data.block_size={n}",
        cwd=Path(__file__).parents[1],
    )
    assert f"holds {n} tokens, fewer than one block of block_size + 1 = {n + 1}" in last_error(out)

    meta_path.write_text(json.dumps({**meta, "tokens": {"train": n + 5, "validation": 0}}))
    with pytest.raises(ValueError, match=r"train.bin holds \d+ bytes but meta.json says"):
        read_meta(tmp_path / "tokens")
    meta_path.write_text(json.dumps({**meta, "vocab_size": 70_000}))
    with pytest.raises(ValueError, match="a vocabulary of 70000 does not fit dtype uint16"):
        read_meta(tmp_path / "tokens")
    with pytest.raises(FileNotFoundError, match="holds no meta.json"):
        read_meta(tmp_path)
