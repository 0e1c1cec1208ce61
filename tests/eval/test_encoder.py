"""`Encoder` and `gpt-ft embed`: a fine-tuned embedding checkpoint's vectors are the training path's
own (the data module's batches through the module), in order, unit length; `gpt-ft embed` writes
them as .npy or beside the rows; a row without a text is named by its file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt_ft.adapters.outputs import TaskDataError
from gpt_ft.cli import main
from tests.background import gpt_ft
from tests.helpers import MICRO, sentence

CARD = """class_path: gpt_ft.adapters.Embedding
init_args:
  name: pairs
  negatives: negatives
  num_negatives: 2
  query_prompt: "query: "
  document_prompt: "passage: "
  index: null
  local:
    splits: {train: train.jsonl, validation: validation.jsonl, test: test.jsonl}
"""


def write_pairs(root: Path) -> Path:
    """16/8/8 anchors with their positives (and a negative every other row), and CARD, in `root`."""
    for split, n in (("train", 16), ("validation", 8), ("test", 8)):
        with (root / f"{split}.jsonl").open("w") as f:
            for i in range(n):
                row = {
                    "anchor": sentence(i),
                    "positive": sentence(i + 1),
                    "negatives": [sentence(i + 7)][: i % 2],
                }
                f.write(json.dumps(row) + "\n")
    (root / "card.yaml").write_text(CARD)
    return root


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, tokenizer_dir):
    root = write_pairs(tmp_path_factory.mktemp("embedding"))
    logs = root / "logs"
    main(
        [
            "fit",
            f"--data.task={root / 'card.yaml'}",
            f"--data.tokenizer={tokenizer_dir}",
            f"--data.data_dir={root}",
            "--data.batch_size=4",
            "--data.max_length=64",
            "--model.preset=gpt-micro",
            f"--model.overrides={MICRO}",
            "--trainer.max_epochs=1",
            f"--trainer.default_root_dir={root}",
            f"--trainer.logger.init_args.save_dir={logs}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    return root, logs / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def test_the_encoders_vectors_are_the_training_paths_own(embedded):
    from gpt_ft import Encoder
    from gpt_ft.data.task_data import TaskDataModule
    from gpt_ft.weights.checkpoint import Checkpoint

    root, ckpt = embedded
    encoder = Encoder.from_checkpoint(ckpt, device="cpu")
    texts = [sentence(i) for i in range(8)]  # the validation anchors, in order
    vectors = encoder.encode(texts, batch_size=3, convert_to="torch")
    assert vectors.shape == (8, encoder.dimensions)
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(8))
    tokenizer = str(Checkpoint.read(ckpt).tokenizer)
    data = TaskDataModule(
        task=encoder.task, tokenizer=tokenizer, data_dir=str(root), batch_size=8, max_length=64
    )
    data.setup("validate")
    batch = next(iter(data.val_dataloader()[0]))  # the card's own encoding and collation
    with torch.no_grad():
        anchors = encoder.classifier.outputs(batch)[:, 0]
    torch.testing.assert_close(vectors, anchors, atol=1e-5, rtol=0)
    # A text as a document gets the card's document prompt: another vector.
    assert not torch.allclose(encoder.encode(texts[:1], prompt="document", convert_to="torch"), vectors[:1])
    # A text alone, a row that is no text, a prompt it has not: one sentence each, not vectors.
    with pytest.raises(
        TypeError, match=r"^encode takes a list of texts, got the text 'hello': put it in a list"
    ):
        encoder.encode("hello")
    with pytest.raises(TypeError, match=r"^encode takes a list of texts, got None: put it in a list\.$"):
        encoder.encode(None)  # a bare "'NoneType' object is not iterable" before
    with pytest.raises(TypeError, match=r"^encode takes texts; item 1 is None\.$"):
        encoder.encode(["a", None])
    with pytest.raises(ValueError, match=r"^item 1 holds \\ud83d, half of a UTF-16 surrogate pair alone, "):
        encoder.encode(["a", "broken \ud83d"])
    with pytest.raises(TypeError, match=r"^encode takes a list of texts, got b'hi': put it in a list"):
        encoder.encode(b"hi")  # ("item 0 is 104")
    # A mapping or a table iterates over its keys, which were embedded as if they were the texts.
    import pandas

    for given, kind in (({"text": "a dog"}, "a mapping"), (pandas.DataFrame({"text": ["a dog"]}), "a table")):
        with pytest.raises(
            TypeError, match=rf"^encode takes a list of texts, got {kind}: give its texts' column"
        ):
            encoder.encode(given)
    with pytest.raises(ValueError, match=r"^prompt must be 'query', 'document' or None, got 'passage'\.$"):
        encoder.encode(texts, prompt="passage")
    with pytest.raises(ValueError, match=r"^convert_to must be 'numpy' or 'torch', got 'tensor'\.$"):
        encoder.encode(texts, convert_to="tensor")  # numpy's array before
    with pytest.MonkeyPatch.context() as patch:  # a chunk of texts (whole batches) encoded at a time
        patch.setattr("gpt_ft.eval.encoder.CHUNK", 2)
        ticks = []
        chunked = encoder.encode(
            texts, batch_size=3, convert_to="torch", progress=lambda b: ticks.extend(b) or b
        )
        sizes = []
        patch.setattr(
            encoder, "tokens", lambda t, p, tokens=encoder.tokens: sizes.append(len(t)) or tokens(t, p)
        )
        encoder.encode(texts, batch_size=3)
    assert sizes == [3, 3, 2] and ticks == [0, 1, 2]
    torch.testing.assert_close(chunked, vectors, atol=1e-6, rtol=0)
    # A card that strips its texts (SST-2's): the prompt and text stripped together, as training
    # reads an anchor (`card_texts`); a text's trailing spaces give the vector of the text without.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encoder.task, "strip_texts", True)
        patch.setattr(encoder.task, "query_prompt", " query: ")
        spaced = f"  {texts[0]}  "
        read = encoder.task.card_texts({"anchor": spaced, "positive": texts[1]})[0]
        assert read == f"query:   {texts[0]}"
        tokens = encoder.classifier.tokenizer(read, add_special_tokens=False)["input_ids"]
        assert encoder.tokens([spaced], "query") == [tokens]
        both = encoder.encode([f"{texts[0]}  ", texts[0]], convert_to="torch")
        torch.testing.assert_close(both[0], both[1], atol=0, rtol=0)
    vectors.add_(1)  # a plain tensor, for any use (an inference tensor refused this)
    assert encoder.classifier.raw_outputs([{"anchor": texts[0], "positive": texts[1]}]).add_(1) is not None
    assert encoder.encode(iter(texts[:2])).shape == (2, encoder.dimensions)  # any iterable of texts


def test_a_text_files_lines_end_at_newlines_only(tmp_path):
    """U+2028, a form feed or a lone carriage return stays inside its line (one vector a line)."""
    from gpt_ft.eval.encoder import read_texts

    path = tmp_path / "in.txt"
    path.write_bytes("a\u2028b\nc\x0cd\r\ne\rf\nlast".encode())
    rows, texts = read_texts(path, "text")
    assert texts == ["a\u2028b", "c\x0cd", "e\rf", "last"] and rows[0] == {"text": "a\u2028b"}
    path.write_text("")
    assert read_texts(path, "text") == ([], [])
    path.write_text("a cat\n \nlast\n")  # no text to embed, as training refuses an empty anchor
    with pytest.raises(
        TaskDataError, match=re.escape(f"{path}, line 2 is empty: each line is a text to embed.")
    ):
        read_texts(path, "text")


def test_a_tables_texts_are_read_as_training_reads_them(tmp_path):
    from gpt_ft.eval.encoder import read_texts

    path = tmp_path / "in.jsonl"
    path.write_text('{"text": 5}\n{"text": "a cat"}\n')
    assert read_texts(path, "text")[1] == ["5", "a cat"]  # a number is its digits, as in training
    for bad, reason in (
        ("null", "has no value: a text to embed"),
        ('" "', "is empty: a text to embed"),
        ('["a"]', "holds a list ['a'], not a text"),
    ):
        path.write_text(f'{{"text": "a cat"}}\n{{"text": {bad}}}\n')
        with pytest.raises(TaskDataError, match=re.escape(f"{path}, line 2: field 'text' {reason}.")):
            read_texts(path, "text")


def test_gpt_ft_embed_writes_vectors_as_npy_or_beside_the_rows(embedded, tmp_path, capsys):
    from gpt_ft import Encoder

    root, ckpt = embedded
    texts = [sentence(i) for i in range(5)]
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(texts).encode() + b"\r\n")  # BOM, CRLF
    main(["embed", f"--ckpt_path={ckpt}", f"--input={tmp_path / 'in.txt'}", f"--output={tmp_path / 'v.npy'}"])
    assert "embedded 5 texts" in capsys.readouterr().out
    # A text longer than a sequence's room is cut, and said (as `gpt-ft label` says it), not unsaid.
    (tmp_path / "long.txt").write_text("a cat .\n" + "word " * 200 + "\n")
    main(
        ["embed", f"--ckpt_path={ckpt}", f"--input={tmp_path / 'long.txt'}", f"--output={tmp_path / 'l.npy'}"]
    )
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"embedded 2 texts of {tmp_path / 'long.txt'} into {tmp_path / 'l.npy'} (32 dimensions)",
        f"{tmp_path / 'long.txt'}: 1 of 2 texts (50.0%) are longer than max_length 64 and are cut.",
    ]
    expected = Encoder.from_checkpoint(ckpt, device="cpu").encode(texts)
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expected, atol=1e-6)
    rows = [{"id": i, "body": t} for i, t in enumerate(texts)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    main(
        [
            "embed",
            f"--ckpt_path={ckpt}",
            f"--input={tmp_path / 'in.jsonl'}",
            f"--output={out}",
            "--field=body",
        ]
    )
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["body"]) for r in written] == [(r["id"], r["body"]) for r in rows]
    np.testing.assert_allclose(np.array([r["embedding"] for r in written]), expected, atol=1e-6)
    # A row's own embedding field is kept; the vector goes beside it, and the summary says where.
    (tmp_path / "in.jsonl").write_text('{"body": "a cat", "embedding": [0.5]}\n{"body": "a dog"}\n')
    main(["embed", f"--ckpt_path={ckpt}", f"--input={tmp_path / 'in.jsonl'}", f"--output={out}",
          "--field=body", "--overwrite=true"])  # fmt: skip
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written[0]["embedding"] == [0.5] and "embedding" not in written[1]
    assert [len(r["embedding_1"]) for r in written] == [32, 32]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"embedded 2 texts of {tmp_path / 'in.jsonl'} into {out} (32 dimensions; as embedding_1: the rows "
        "have an embedding field, kept)"
    )


@pytest.mark.parametrize(
    "data, message",
    [
        (b"the cat sat .\ncaf\xe9 au lait\n",
         "{path}, line 2: not UTF-8 text (byte 0xe9: invalid continuation byte); save it as UTF-8."),
        (b"", "--input {path} holds no texts."),
    ],
)  # fmt: skip
def test_a_text_file_that_is_not_utf8_or_empty_is_one_sentence(embedded, tmp_path, capsys, data, message):
    _, ckpt = embedded
    (tmp_path / "in.txt").write_bytes(data)
    with pytest.raises(SystemExit):
        main(
            [
                "embed",
                f"--ckpt_path={ckpt}",
                f"--input={tmp_path / 'in.txt'}",
                f"--output={tmp_path / 'o.npy'}",
            ]
        )
    assert capsys.readouterr().err.strip().splitlines()[-1] == "gpt-ft: error: " + message.format(
        path=tmp_path / "in.txt"
    )
    assert not (tmp_path / "o.npy").exists()


def test_a_row_without_a_text_is_named_by_its_line(embedded, tmp_path, capsys):
    """A number is a text, as in training (its digits); a row without the field is named."""
    _, ckpt = embedded
    (tmp_path / "in.jsonl").write_text('{"text": "a cat"}\n{"text": 5}\n{"title": "no text"}\n')
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "embed",
                f"--ckpt_path={ckpt}",
                f"--input={tmp_path / 'in.jsonl'}",
                f"--output={tmp_path / 'o.npy'}",
            ]
        )
    assert stop.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message == (
        f"gpt-ft: error: {tmp_path / 'in.jsonl'}, line 3: the row has no field 'text' (a text to embed; "
        "--field NAME reads another)."
    )
    assert not (tmp_path / "o.npy").exists()
    # A table whose header lacks the field: the header's fault (it was "line 2"), its columns named.
    from tests.cli.test_bad_files import error_of

    (tmp_path / "in.tsv").write_text("sentence\tlabel\na cat\t1\n")
    embed = [
        "embed",
        f"--ckpt_path={ckpt}",
        f"--input={tmp_path / 'in.tsv'}",
        f"--output={tmp_path / 'o.npy'}",
    ]
    assert error_of(embed, capsys) == (
        f"gpt-ft: error: {tmp_path / 'in.tsv'} has no column 'text' to embed; its columns: sentence, label "
        "(--field NAME reads another)."
    )


def test_a_classifier_checkpoint_is_not_an_encoder_nor_an_encoder_a_classifier(
    finetuned, embedded, tmp_path, capsys
):
    """Each command named with the other kind of checkpoint says which it is and which command
    serves it, naming the checkpoint (label used to blame the input's missing fields)."""
    from gpt_ft import Encoder

    with pytest.raises(ValueError, match=r"is a model of task '\w+', not an embedding model: `gpt-ft label`"):
        Encoder.from_checkpoint(finetuned.ckpt, device="cpu")
    _, ckpt = embedded
    (tmp_path / "in.tsv").write_text("sentence\nthe cat sat .\n")
    with pytest.raises(SystemExit):
        main(
            [
                "label",
                f"--ckpt_path={ckpt}",
                f"--input={tmp_path / 'in.tsv'}",
                f"--output={tmp_path / 'o.tsv'}",
            ]
        )
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"gpt-ft: error: {ckpt} is an embedding model (task ")
    assert message.endswith("`gpt-ft embed` writes its vectors.") and not (tmp_path / "o.tsv").exists()
    out = tmp_path / "o.npy"
    with pytest.raises(SystemExit):  # the checkpoint is named, not the input's missing 'text' field
        main(["embed", f"--ckpt_path={finetuned.ckpt}", f"--input={tmp_path / 'in.tsv'}", f"--output={out}"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"gpt-ft: error: {finetuned.ckpt} is a model of task ")
    from gpt_ft.weights.checkpoint import Checkpoint

    language_model = Checkpoint.read(finetuned.ckpt)
    del language_model.data_args["task"]  # as a plain lightning.Trainer saves a fine-tuned model
    language_model.save(tmp_path / "plain.ckpt")
    from gpt_ft import Classifier

    with pytest.raises(ValueError, match=r"plain.ckpt holds a task head but records no task card: it was"):
        Classifier.from_checkpoint(tmp_path / "plain.ckpt", device="cpu")
    language_model.state = {k: v for k, v in language_model.state.items() if not k.startswith("head.")}
    language_model.save(tmp_path / "lm.ckpt")  # as a pretraining run records its data: no head, no card
    with pytest.raises(SystemExit):  # named before the input's missing 'text' field
        main(
            [
                "embed",
                f"--ckpt_path={tmp_path / 'lm.ckpt'}",
                f"--input={tmp_path / 'in.tsv'}",
                f"--output={out}",
            ]
        )
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        message
        == f"gpt-ft: error: {tmp_path / 'lm.ckpt'} is not a fine-tuned gpt_ft checkpoint: it records no task "
        "card."
    )
    (tmp_path / "in.doc").write_text("a cat\n")
    with pytest.raises(SystemExit):  # an unknown extension is the input's fault (there is no card here)
        main(["embed", f"--ckpt_path={ckpt}", f"--input={tmp_path / 'in.doc'}", f"--output={out}"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message == (
        f"gpt-ft: error: --input {tmp_path / 'in.doc'}: "
        "give a .txt, .csv, .tsv, .json/.jsonl or .parquet file (by its extension)."
    )
    assert not out.exists()


def start_embedding_suite(root, tokenizer_dir):
    write_pairs(root)
    (root / "suite.yaml").write_text(
        f"name: embeddings\nseeds: [0]\ntrain_sizes: [8, all]\ntasks:\n  - card: {root / 'card.yaml'}\n"
    )
    fit = "[--model.preset=gpt-micro, --data.max_length=64, --data.batch_size=4, --trainer.max_epochs=1, "
    fit += "--trainer.enable_progress_bar=false, --trainer.enable_model_summary=false]"
    return [gpt_ft("suite", str(root / "suite.yaml"), f"--out_dir={root / 'out'}", f"--data_dir={root}",
                   f"--tokenizer={tokenizer_dir}", f"--fit_args={fit}", cwd=root)]  # fmt: skip


@pytest.mark.background(start=start_embedding_suite)
def test_a_suite_runs_an_embedding_card_with_its_learning_curve(background):
    """`gpt-ft suite` on an embedding card: the retrieval metrics per seed, the main one on a
    learning curve over training sizes (rows with no label column are one stratum)."""
    (run,) = background.runs
    assert run.returncode == 0, run.stderr[-3000:]
    task = json.loads((background.root / "out" / "results.json").read_text())["tasks"]["pairs"]
    assert task["main_metric"] == "validation/mrr@10"
    assert set(task["metrics"]) == {f"validation/{m}" for m in ("mrr@10", "ndcg@10", "recall@1", "recall@10")}
    for metric in task["metrics"].values():
        assert 0 <= metric["seeds"]["0"] <= 100
    curve = task["curves"]["fine-tuned"]
    assert (curve["8"]["examples"], curve["all"]["examples"]) == (8, 16)


@pytest.mark.parametrize(
    "pooling, read",
    [("extract", ["extract at 8", "extract at 11"]), ("last", ["read at 7", "read at 10"]),
     ("mean", ["their mean read"] * 2)],
)  # fmt: skip
def test_explain_says_where_each_pooling_reads_a_texts_vector(
    embedded, tokenizer_dir, tmp_path, capsys, pooling, read
):
    """`[start] query: text [extract]`, or without the extract token where the text's own tokens are read."""
    root, _ = embedded
    (tmp_path / "card.yaml").write_text(
        CARD.replace("  index: null\n", f"  index: null\n  pooling: {pooling}\n")
    )
    capsys.readouterr()
    argv = [
        f"--data.task={tmp_path / 'card.yaml'}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={root}",
    ]
    main(["explain", *argv])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sequence")]
    extract = pooling == "extract"
    assert lines == [
        f"sequence 0 ({8 + extract} tokens, {read[0]}):",
        f"sequence 1 ({11 + extract} tokens, {read[1]}):",
    ]
    main(["explain", *argv, "--json=true"])
    shown = json.loads(capsys.readouterr().out)
    at = {"extract": [8, 11], "last": [7, 10], "mean": [None, None]}[pooling]  # a mean has no one position
    assert (shown["pooling"], [s["extract_index"] for s in shown["sequences"]]) == (pooling, at)
