"""`Classifier` and `gpt-ft label`: a fine-tuned checkpoint used from Python and on a file.

That the classifier agrees with `gpt-ft predict` and the data module's batches for every input
shape is checked where each shape is fine-tuned (tests/cli/test_lightning.py,
`assert_classifier_agrees`)."""

import csv
import math
import re
import sys
from pathlib import Path

import numpy
import pytest
import torch

from gpt_ft import Classifier
from gpt_ft.adapters import TaskDataError
from gpt_ft.cli import main
from gpt_ft.data.files import labelled_rows, read_table
from tests.helpers import BAD, GOOD


def test_examples_name_the_cards_fields(finetuned):
    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    [result] = clf.predict([{"sentence": "the cat sat on the mat ."}])
    assert result["label"] in ("negative", "positive")
    assert set(result["scores"]) == {"negative", "positive"}
    assert sum(result["scores"].values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"example 0 has no field 'sentence'"):
        clf.predict([{"text": "another field"}])
    # A text, or one example, where a list of examples goes: one sentence, not an AttributeError.
    for given in ("a gripping film", {"sentence": "a gripping film"}, None, b"a film"):  # (bytes: "is 97")
        with pytest.raises(
            TypeError, match=r"^Classifier takes a list of examples, got .*: put it in a list\.$"
        ):
            clf.predict(given)
    with pytest.raises(TypeError, match=r"example 1 is 'a film': give \{'sentence': \.\.\.\}\.$"):
        clf.predict([{"sentence": "a cat ."}, "a film"])
    with pytest.raises(ValueError, match=r"^example 1: field 'sentence' holds \\ud83d, half of a UTF-16 "):
        clf.predict([{"sentence": "a cat ."}, {"sentence": "broken \ud83d"}])  # (the tokenizer's TypeError)
    import pandas as pd

    table = pd.DataFrame({"sentence": ["a cat .", "a film"]})  # (it iterates over its column names)
    with pytest.raises(TypeError, match=r"got a table: give table.to_dict\('records'\)\.$"):
        clf.predict(table)
    assert len(clf.predict(table.to_dict("records"))) == 2


def test_a_long_list_is_predicted_a_chunk_at_a_time_each_example_read_first(finetuned, monkeypatch):
    """`predict` encodes and runs `CHUNK` examples at a time, as `gpt-ft label` runs a file: the
    outcomes are the whole list's; a bad example in the last chunk is named, by its place
    in the whole list, before any chunk runs."""
    from gpt_ft.eval import classifier

    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    examples = [
        {"sentence": " ".join(["cat", "mat", "dog"][: 1 + i % 3] * (1 + i % 4)) + " ."} for i in range(10)
    ]
    whole = clf.predict(examples, batch_size=2)
    monkeypatch.setattr(classifier, "CHUNK", 4)
    runs, run_encoded = [], Classifier.run_encoded
    monkeypatch.setattr(
        Classifier,
        "run_encoded",
        lambda self, enc, **kw: runs.append(len(enc)) or run_encoded(self, enc, **kw),
    )
    chunked = clf.predict(examples, batch_size=2)  # (batched apart: equal to float rounding)
    assert [c["label"] for c in chunked] == [w["label"] for w in whole] and runs == [4, 4, 2]
    assert [c["scores"] for c in chunked] == [pytest.approx(w["scores"], abs=1e-6) for w in whole]
    with pytest.raises(ValueError, match=r"^example 9 has no field 'sentence'"):
        clf.predict([*examples[:9], {"text": "a cat ."}])
    assert runs == [4, 4, 2]  # none ran


def test_a_checkpoint_path_from_home_is_expanded(finetuned, monkeypatch):
    """`~/...` as the shell would read it unquoted: `--input` and `generate` took it, the checkpoint not."""
    monkeypatch.setenv("HOME", str(finetuned.logs))
    clf = Classifier.from_checkpoint("~/lightning_logs/version_0/checkpoints/last.ckpt", device="cpu")
    assert clf.predict([{"sentence": "a cat ."}])[0]["label"] in ("negative", "positive")


def test_a_checkpoint_whose_tokenizer_folder_was_replaced_is_refused(finetuned, tmp_path):
    """Another tokenizer in the checkpoint's `tokenizer/` (a copy put together by hand): `label`,
    `Classifier` and `export` read every text as its ids without a word (`validate` refused it)."""
    import shutil

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    shutil.copy(finetuned.ckpt, ckpt := tmp_path / "last.ckpt")
    small = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "cat": 2}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=small, unk_token="<unk>").save_pretrained(tmp_path / "tokenizer")
    with pytest.raises(
        ValueError, match=rf"^{tmp_path / 'tokenizer'} holds 7 tokens, but the weights in {ckpt} "
    ):
        Classifier.from_checkpoint(ckpt, device="cpu")


def test_a_checkpoints_head_and_temperature_are_checked_before_they_score(finetuned):
    """A head of another width or kind (a traceback, or cast and used), a temperature no score can
    be divided by (scores NaN, or against the label chosen): one sentence naming the checkpoint."""
    from gpt_ft.weights.checkpoint import Checkpoint

    def refusal(**entries) -> str:
        stored = Checkpoint.read(finetuned.ckpt)  # (edited in memory: the file stays as it is)
        stored.entries.update(entries.pop("top", {}))
        stored.state = {**stored.state, **entries}
        with pytest.raises(ValueError) as raised:
            Classifier.from_checkpoint(stored, device="cpu")
        return str(raised.value).replace(str(finetuned.ckpt), "last.ckpt")

    assert refusal(**{"head.weight": torch.zeros(2, 3)}) == (
        "last.ckpt's tensors do not fit the head of task 'sent': size mismatch for head.weight: copying a "
        "param with shape torch.Size([2, 3]) from checkpoint, the shape in current model is "
        "torch.Size([2, 32])."
    )
    assert refusal(**{"head.weight": torch.zeros(2, 32, dtype=torch.int64)}) == (
        "last.ckpt: its tensor head.weight holds int64 values, not real floating-point ones as a model's "
        "weights are (the file was altered or is damaged)."
    )
    for temperature in (-1.0, 0.0, math.nan):
        assert refusal(top={"temperature": temperature}) == (
            f"last.ckpt records a temperature of {temperature!r}, and gpt-ft calibrate's is a positive "
            "number (every score is divided by it): calibrate the checkpoint again."
        )
    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")  # one given in Python: checked too
    for temperature in (-1.0, 0, math.nan, math.inf, "2"):
        with pytest.raises(
            ValueError, match=r"^temperature must be a positive number \(every score is divided"
        ):
            Classifier(
                clf.gpt,
                clf.head,
                clf.task,
                clf.tokenizer,
                max_length=64,
                device="cpu",
                temperature=temperature,
            )


def test_packed_and_padded_batches_give_the_same_probabilities(finetuned):
    """`Classifier` packs its batches by default; padded ones (`packing=False`) agree to 1e-5."""
    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    assert clf.packing
    sentences = [{"sentence": " ".join(["word"] * n) + " ."} for n in (1, 7, 3, 12, 2, 5)]
    packed = clf.raw_outputs(sentences, batch_size=4)
    clf.packing = False
    torch.testing.assert_close(clf.raw_outputs(sentences, batch_size=4), packed, rtol=0, atol=1e-5)


def test_a_classifier_of_modules_in_training_scores_without_dropout_and_leaves_their_modes(finetuned):
    """Built on a model mid-training (a hand-written loop's evaluation), it turned the modules to eval
    mode for good: the loop then trained on with dropout off."""
    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    sentences = [{"sentence": "the cat sat on the mat ."}, {"sentence": "a film"}]
    expected = clf.raw_outputs(sentences)
    gpt, head = clf.gpt.train(), clf.head.train()
    assert gpt.config.resid_pdrop > 0
    gpt.h[0].eval()  # (a part the caller froze stays so)
    modes = [m.training for m in (*gpt.modules(), *head.modules())]
    training = Classifier(gpt, head, clf.task, clf.tokenizer, max_length=clf.max_length, device="cpu")
    torch.testing.assert_close(training.raw_outputs(sentences), expected, rtol=0, atol=0)
    assert [m.training for m in (*gpt.modules(), *head.modules())] == modes


def test_a_long_file_shows_its_batches_on_a_terminal_only(finetuned, capsys):
    """`gpt-ft label` and `embed` wrap their batches in a bar (`progress`), on stderr where it is a
    terminal; in a log or a pipe, as here, a line every 30 s (none in a run this short)."""
    from gpt_ft.eval.progress import batches_bar

    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    sentences = [{"sentence": " ".join(["word"] * n) + " ."} for n in (1, 7, 3, 12, 2)]
    seen = []

    def progress(batches):
        for batch in batches:
            seen.append(batch)
            yield batch

    assert [o for o, _ in clf.run(sentences, batch_size=2, progress=progress)] == clf.predict(
        sentences, batch_size=2
    )
    assert seen == [0, 2, 4]
    assert list(batches_bar("label")(range(3))) == [0, 1, 2] and capsys.readouterr().err == ""


def test_reading_a_checkpoint_calls_nothing_in_training(finetuned):
    """The checkpoint's format lives below the training layer: `Classifier.from_checkpoint` reads
    it, its weights, card and tokenizer without calling a function of gpt_ft/training/."""
    import gpt_ft

    training = str(Path(gpt_ft.__file__).parent / "training")
    called = set()

    def profile(frame, event, arg):
        if event == "call":
            called.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    finally:
        sys.setprofile(None)
    assert clf.task.name and any("gpt_ft/weights/checkpoint.py" in f for f in called)
    assert sorted(f for f in called if f.startswith(training)) == []


def test_label_reads_a_file_laid_out_as_the_cards_own(finetuned, tmp_path):
    """A card that renames a file's column (`columns: {review: sentence}`, as GLUE's MRPC renames
    `#1 String`): its own files are labelled as they are, their columns written back unrenamed."""
    import shutil

    stored = torch.load(finetuned.ckpt, map_location="cpu", weights_only=True)
    stored["data_config"]["init_args"]["task"]["init_args"]["local"]["columns"]["review"] = "sentence"
    ckpt = tmp_path / "run" / "renamed.ckpt"
    shutil.copytree(finetuned.ckpt.parent / "tokenizer", ckpt.parent / "tokenizer")
    torch.save(stored, ckpt)
    texts = ["the cat sat on the mat .", "two dogs run in a park ."]
    (tmp_path / "own.tsv").write_text("review\n" + "\n".join(texts) + "\n")
    (tmp_path / "fields.tsv").write_text("sentence\n" + "\n".join(texts) + "\n")
    for name in ("own", "fields"):
        main(
            [
                "label",
                f"--ckpt_path={ckpt}",
                f"--input={tmp_path / name}.tsv",
                f"--output={tmp_path / name}.out.tsv",
            ]
        )
    own, fields = ((tmp_path / f"{n}.out.tsv").read_text().splitlines() for n in ("own", "fields"))
    assert own[0] == "review\tprediction" and own[1:] == fields[1:]


def test_label_writes_each_row_with_its_prediction(finetuned, tmp_path, capsys):
    ckpt = finetuned.ckpt
    source = tmp_path / "mine.tsv"
    source.write_text('sentence\tnote\nthe cat sat on the mat .\tx\ntwo dogs "run" in a park .\ty\n')
    before = source.read_bytes()
    main(["label", f"--ckpt_path={ckpt}", f"--input={source}", f"--output={tmp_path / 'out.tsv'}"])
    with (tmp_path / "out.tsv").open() as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    clf = Classifier.from_checkpoint(ckpt, device="cpu")
    expected = [r["label"] for r in clf.predict(read_table(source).to_list())]
    assert rows[0] == ["sentence", "note", "prediction"]
    assert [r[:2] for r in rows[1:]] == [
        ["the cat sat on the mat .", "x"],
        ['two dogs "run" in a park .', "y"],
    ]
    assert [r[2] for r in rows[1:]] == expected
    main(["label", f"--ckpt_path={ckpt}", f"--input={source}", f"--output={tmp_path / 'out.jsonl'}"])
    assert '"prediction": ' in (tmp_path / "out.jsonl").read_text()
    long = tmp_path / "long.tsv"  # a text past the checkpoint's max_length (64) is cut, and counted
    long.write_text("sentence\n" + "the cat sat on the mat . " * 12 + "\nthe cat sat .\n")
    capsys.readouterr()
    main(["label", f"--ckpt_path={ckpt}", f"--input={long}", f"--output={tmp_path / 'long.csv'}"])
    assert capsys.readouterr().out.splitlines() == [
        f"labelled 2 examples of {long} into {tmp_path / 'long.csv'}",
        f"{long}: 1 of 2 examples (50.0%) are longer than max_length 64 and are cut.",
    ]
    records = tmp_path / "mine.jsonl"  # a record without a note, and a null one: empty cells, as csv writes
    records.write_text('{"sentence": "a cat .", "note": null}\n{"sentence": "a dog ."}\n')
    with records.open(
        "a"
    ) as f:  # line breaks (CR LF too) and tabs in a text: a space each in a TSV (a row a line)
        f.write('{"sentence": "a bird .", "note": "one\\rtwo\\tthree\\r\\nfour"}\n')
    main(["label", f"--ckpt_path={ckpt}", f"--input={records}", f"--output={tmp_path / 'notes.tsv'}"])
    lines = (tmp_path / "notes.tsv").read_text().splitlines()
    assert [line.split("\t")[:2] for line in lines] == [
        ["sentence", "note"],
        ["a cat .", ""],
        ["a dog .", ""],
        ["a bird .", "one two three four"],
    ]
    # A list in a record is JSON in a table's cell; a .json output is one array, read back as the input is.
    records = tmp_path / "listed.jsonl"
    records.write_text('{"sentence": "a cat .", "note": ["x", "ü"]}\n')
    for name in ("notes.csv", "notes.json"):
        main(["label", f"--ckpt_path={ckpt}", f"--input={records}", f"--output={tmp_path / name}"])
    with (tmp_path / "notes.csv").open(newline="") as f:
        assert list(csv.reader(f))[1][:2] == ["a cat .", '["x", "ü"]']
    back = read_table(tmp_path / "notes.json").to_list()
    assert (
        len(back) == 1 and back[0]["note"] == ["x", "ü"] and back[0]["prediction"] in ("negative", "positive")
    )
    broken = tmp_path / "broken.csv"  # the card's `sentence` column missing: named with its file and line
    broken.write_text("text,note\na cat .,x\n")
    with pytest.raises(SystemExit):
        main(["label", f"--ckpt_path={ckpt}", f"--input={broken}", f"--output={tmp_path / 'b.tsv'}"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (  # the header's fault: it was "line 2"
        f"gpt-ft: error: {broken} has no column 'sentence', which task 'sent' reads; its columns: text, note."
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["label", f"--ckpt_path={ckpt}", f"--input={source}", f"--output={source}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: --output {source} is the input file: give another name, the input is kept."
    )
    assert source.read_bytes() == before


def test_label_reads_a_file_laid_out_as_the_cards_headerless_ones(finetuned, tmp_path, monkeypatch, capsys):
    """A card that reads some files without a header (CoLA's train and dev) labels such a file as
    fit reads it (its first line was taken for the header, and `sentence` named missing), and writes
    it as it was laid out, without a header (one was added, which the card then read as a row); a
    file of one such line too (it was said to hold no rows)."""
    from gpt_ft.adapters import LocalFiles
    from gpt_ft.eval import classifier

    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    names = ["source", "label", "mark", "sentence"]
    clf.task.sources.local = LocalFiles(
        splits={"train": "t.tsv"}, column_names=names, headerless_splits=["train"]
    )
    monkeypatch.setattr(classifier.Classifier, "from_checkpoint", lambda *a, **k: clf)
    source, out = tmp_path / "dev.tsv", tmp_path / "out.tsv"
    source.write_text("gj04\t1\t\tthe cat sat on the mat .\ngj04\t0\t*\ttwo dogs run in a park .\n")
    main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={out}"])
    expected = [r["label"] for r in clf.predict([{"sentence": GOOD}, {"sentence": BAD}])]
    assert out.read_text().splitlines() == [
        f"gj04\t1\t\t{GOOD}\t{expected[0]}",
        f"gj04\t0\t*\t{BAD}\t{expected[1]}",
    ]
    source.write_text("gj04\t1\t\tthe cat sat on the mat .\n")
    main(
        ["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={out}", "--overwrite=true"]
    )
    assert out.read_text().splitlines() == [f"gj04\t1\t\t{GOOD}\t{expected[0]}"]
    other = tmp_path / "out.csv"  # in another format: the columns named (nothing would read them by place)
    main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={other}"])
    assert other.read_text().splitlines() == [
        "source,label,mark,sentence,prediction",
        f"gj04,1,,{GOOD},{expected[0]}",
    ]
    source.write_bytes(
        b"gj04\t1\t\tcaf\xe9 .\n"
    )  # not UTF-8: its line named (the header's read said nothing)
    with pytest.raises(SystemExit):
        main(
            ["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={tmp_path / 'n.tsv'}"]
        )
    assert f"{source}, line 1: not UTF-8 text" in capsys.readouterr().err
    source.write_text("id\tgold\tmark\ttext\nx\t1\t\tthe cat .\n")  # a header of other names: none is a label
    with pytest.raises(SystemExit):
        main(
            ["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={tmp_path / 'o.tsv'}"]
        )
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"{source} has no column 'sentence', which task 'sent' reads; its columns: id, gold, mark, text."
        )
    )
    source.write_text("sentence\tnote\nthe cat .\tx\n")  # a header of the card's fields: read as ever
    main(
        ["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={out}", "--overwrite=true"]
    )
    assert out.read_text().splitlines()[0] == "sentence\tnote\tprediction"
    assert capsys.readouterr().out.startswith(f"labelled 1 example of {source} into {out}\n")
    source.write_text("sentence\tnote\nthe cat .\tx\n\nthe dog .\ty\n\n")  # a blank line between rows: said
    main(
        ["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={out}", "--overwrite=true"]
    )
    assert capsys.readouterr().out.startswith(
        f"labelled 2 examples of {source} into {out}; blank line 3 left out\n"
    )
    assert len(out.read_text().splitlines()) == 3


def test_a_headerless_multi_label_files_first_line_is_a_row():
    """GoEmotions' TSVs have no header and join label ids with commas: a first row of two labels
    ("15,17") was taken for the header, and line 2 named as missing the text field."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.eval.labelling import reads_as_data
    from tests.helpers import TASKS

    task = load_card(str(TASKS / "go_emotions.yaml"))
    assert reads_as_data(task, ["thanks , great", "15,17", "e1"], {})
    assert reads_as_data(task, ["so happy", "17", "e2"], {}) and reads_as_data(task, ["meh", "", "e3"], {})
    assert not reads_as_data(task, ["words", "emotions", "key"], {})  # a header of other names
    assert not reads_as_data(task, ["text", "labels", "id"], {})  # the card's own names


def test_label_writes_a_reward_models_probability_beside_its_own(tmp_path):
    """A preference outcome's `probability` (P(first > second)) is written to json and jsonl as
    `Classifier.predict` gives it, named beside a column of the file's own; a table gets the
    prediction alone."""
    import json

    from gpt_ft.eval.labelling import labelled_file, write_labelled

    rows = [{"chosen": "a", "rejected": "b", "probability": "theirs"}]
    outcome = {"label": "chosen", "scores": {"chosen": 1.0, "rejected": -1.0}, "probability": 0.88}
    names = write_labelled(tmp_path / "out.jsonl", rows, [(outcome, "2.0000")])
    assert names == {"prediction": "prediction", "scores": "scores", "probability": "probability_1"}
    assert json.loads((tmp_path / "out.jsonl").read_text()) == {
        **rows[0], "prediction": "chosen", "scores": outcome["scores"], "probability_1": 0.88}  # fmt: skip
    assert write_labelled(tmp_path / "out.tsv", rows, [(outcome, "2.0000")]) == {"prediction": "prediction"}
    assert (
        tmp_path / "out.tsv"
    ).read_text() == "chosen\trejected\tprobability\tprediction\na\tb\ttheirs\t2.0000\n"
    broken = [{"chosen": "a\r\nb\tc\rd\ne", "rejected": "b", "probability": "p"}]  # a line break: one space
    write_labelled(tmp_path / "broken.tsv", broken, [(outcome, "2.0000")])
    assert (tmp_path / "broken.tsv").read_text().splitlines()[1] == "a b c d e\tb\tp\t2.0000"
    names = write_labelled(tmp_path / "out.parquet", rows, [(outcome, "2.0000")])  # typed, as json's
    assert names["probability"] == "probability_1" and read_table(tmp_path / "out.parquet").to_list() == [
        {**rows[0], "prediction": "chosen", "scores": outcome["scores"], "probability_1": 0.88}
    ]
    mixed = [
        {"note": "x", "chosen": "a"},
        {"note": ["y"], "chosen": "a"},
    ]  # records of JSON lines may so differ
    said = r"cannot hold these rows \(column 'note' holds lists in some rows and single values in others\)"
    with pytest.raises(ValueError, match=rf"^--output \S+out.parquet: parquet {said}; write \.jsonl\.$"):
        write_labelled(tmp_path / "out.parquet", mixed, [(outcome, "2.0000")] * 2)
    assert not list(tmp_path.glob(".*.tmp"))  # and the file before is kept
    assert read_table(tmp_path / "out.parquet").to_list()[0]["probability_1"] == 0.88
    # a later chunk's outcomes may hold a key the first's lacked (a reward model's pairs after single
    # replies): it is written where it comes, in every format that writes the outcome
    single = {"label": "reply", "scores": {"reply": 0.5}}
    for name in ("chunks.jsonl", "chunks.json", "chunks.parquet"):
        with labelled_file(tmp_path / name, ["chosen"]) as out:
            out.write([{"chosen": "a"}], [(single, "0.5")])
            out.write([{"chosen": "b"}], [(outcome, "2.0")])
        assert out.columns_written() == {
            "prediction": "prediction",
            "scores": "scores",
            "probability": "probability",
        }
        written = read_table(tmp_path / name).to_list()
        assert [r.get("probability") for r in written] == [None, 0.88], name
    # a row's own infinities and NaN: kept by parquet (they were nulls), nulls in JSON, which has none
    floats = [{"chosen": "a", "x": math.inf}, {"chosen": "b", "x": -math.inf}, {"chosen": "c", "x": math.nan}]
    write_labelled(tmp_path / "floats.parquet", floats, [(outcome, "2.0000")] * 3)
    x = [r["x"] for r in read_table(tmp_path / "floats.parquet").to_list()]
    assert x[:2] == [math.inf, -math.inf] and math.isnan(x[2])
    write_labelled(tmp_path / "floats.jsonl", floats, [(outcome, "2.0000")] * 3)
    assert [r["x"] for r in read_table(tmp_path / "floats.jsonl").to_list()] == [None] * 3
    # a JSON record may lack a field later ones have: the column is kept, the record's cell empty
    sparse = [{"chosen": "a"}, {"chosen": "c", "note": "n"}]
    write_labelled(tmp_path / "sparse.parquet", sparse, [(outcome, "2.0000")] * 2)
    assert [(r["chosen"], r["note"]) for r in read_table(tmp_path / "sparse.parquet").to_list()] == [
        ("a", None),
        ("c", "n"),
    ]


def test_a_labelled_file_goes_where_a_link_points_and_takes_a_long_name(tmp_path):
    """--output a symbolic link (dangling: its file not yet written) writes the file it names; a
    name near the file system's 255 bytes still has a hidden file beside it."""
    import json

    from gpt_ft.eval.labelling import write_labelled

    rows, outcome = [{"sentence": "a"}], {"label": "1", "scores": {"0": 0.25, "1": 0.75}}
    (tmp_path / "link.tsv").symlink_to(tmp_path / "real.tsv")
    write_labelled(tmp_path / "link.tsv", rows, [(outcome, "1")], overwrite=False)
    assert (tmp_path / "real.tsv").read_text() == "sentence\tprediction\na\t1\n"
    assert (tmp_path / "link.tsv").is_symlink()
    long = tmp_path / ("é" * 100 + "x" * 46 + ".jsonl")  # 250 bytes
    write_labelled(long, rows, [(outcome, "1")], overwrite=False)
    assert json.loads(long.read_text())["prediction"] == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["link.tsv", "real.tsv", long.name])


def test_label_keeps_a_files_own_columns_and_records(finetuned, tmp_path, capsys):
    """Columns named `prediction` or `scores` (a ranking card's gold scores) are kept and the new
    ones named beside them; a parquet date is ISO text in JSON; a JSON record without the card's
    field is named, not labelled as an empty text, and records keep their own keys."""
    import datetime
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    def label(source: Path, output: str) -> Path:
        main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={tmp_path / output}"])
        return tmp_path / output

    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        '{"sentence": "a cat .", "prediction": "gold", "scores": [3, 1]}\n{"sentence": "a dog ."}\n'
    )
    first, second = [json.loads(line) for line in label(gold, "out.jsonl").read_text().splitlines()]
    assert (first["prediction"], first["scores"]) == ("gold", [3, 1]) and set(second) == set(first) - {
        "prediction", "scores"}  # fmt: skip
    assert first["prediction_1"] in ("negative", "positive") and len(first["scores_1"]) == 2
    assert "(as prediction_1 and scores_1: it has such columns)" in capsys.readouterr().out
    table = tmp_path / "gold.tsv"  # a table gets a prediction column alone: only it is named
    table.write_text("sentence\tprediction\na cat .\tx\n")
    assert label(table, "out.tsv").read_text().splitlines()[0] == "sentence\tprediction\tprediction_1"
    assert "(as prediction_1: it has such columns)" in capsys.readouterr().out
    table.write_text("sentence\tscores\na cat .\tx\n")
    label(table, "scores.tsv")
    assert "(as" not in capsys.readouterr().out
    dated = tmp_path / "dated.parquet"
    pq.write_table(pa.table({"sentence": ["a cat ."], "when": [datetime.date(2024, 1, 2)]}), dated)
    assert json.loads(label(dated, "dated.jsonl").read_text())["when"] == "2024-01-02"
    # JSON has no NaN (strict readers refuse Python's): null; bytes are their text, else base64.
    typed = tmp_path / "typed.parquet"
    cells = {"sentence": ["a cat ."], "f": [math.nan], "b": [b"ab"], "raw": [b"\xff"], "x\ty": [1]}
    pq.write_table(pa.table(cells), typed)
    written = json.loads(label(typed, "typed.jsonl").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert (written["f"], written["b"], written["raw"]) == (None, "ab", "/w==")
    header, row = label(typed, "typed.tsv").read_text().splitlines()
    assert header == "sentence\tf\tb\traw\tx y\tprediction"
    assert row.split("\t")[1:5] == ["", "ab", "/w==", "1"]  # NaN: an empty cell, as spreadsheets write it
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"sentence": "a cat ."}\n{"text": "a dog ."}\n')
    with pytest.raises(SystemExit):
        label(missing, "missing.out.jsonl")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {missing}, line 2 has no field 'sentence' (task 'sent')."
    )
    clf = Classifier.from_checkpoint(finetuned.ckpt, device="cpu")
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        clf.predict([{"sentence": "a"}], batch_size=0)
    assert len(clf.predict([{"sentence": "a"}] * 3, batch_size=numpy.int64(2))) == 3  # numpy's: whole
    for typed in ("4", 2.0, None, torch.tensor(2.5), torch.tensor([2, 3]), numpy.bool_(True)):  # (TypeErrors)
        said = re.escape(f"batch_size must be a whole number >= 1, got {typed!r}.")
        with pytest.raises(ValueError, match=f"^{said}$"):
            clf.predict([{"sentence": "a"}], batch_size=typed)


def test_the_classifier_batches_choices_as_the_run_did(tokenizer_dir):
    """A run with `--data.shared_context false` is served with one whole sequence per choice, as it
    was trained and evaluated; by default each context runs once (`TaskDataModule.collator`'s choice)."""
    from gpt_ft.adapters import MultipleChoice
    from gpt_ft.data.batches import SharedContextBatch, TaskBatch
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.model import GPT, GPTConfig

    task = MultipleChoice(name="mc", context=["story"], choices=["a", "b"])
    tokenizer = load_tokenizer(tokenizer_dir)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=len(tokenizer), n_positions=64))
    head = task.head(gpt.config.n_embd, dropout=0.0, init_std=0.02)
    rows = [{"story": "The cat sat on the mat.", "a": "It slept.", "b": "It flew away."}]

    def batch(shared_context: bool):
        clf = Classifier(gpt, head, task, tokenizer, max_length=64, device="cpu", packing=False,
                         shared_context=shared_context)  # fmt: skip
        return clf.batch(clf.encode(rows)), clf.raw_outputs(rows)

    (shared, shared_out), (plain, plain_out) = batch(True), batch(False)
    assert isinstance(shared, SharedContextBatch) and type(plain) is TaskBatch
    torch.testing.assert_close(shared_out, plain_out, rtol=0, atol=1e-5)  # the same scores either way


def test_a_calibrated_multi_label_classifier_decides_as_the_run_did(tokenizer_dir, tmp_path, monkeypatch):
    """The card's threshold applies to the raw sigmoids, as in training and `gpt-ft predict`; the
    temperature changes the probabilities only."""
    from gpt_ft import GPT, GPTConfig
    from gpt_ft.adapters import MultiLabel
    from gpt_ft.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    task = MultiLabel(name="m", labels=["x", "y", "z"], threshold=0.3)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=len(tok))).eval()
    clf = Classifier(
        gpt, task.head(gpt.config.n_embd, dropout=0.0, init_std=0.3), task, tok, max_length=64, device="cpu"
    )
    rows = [
        {"text": t} for t in ["the cat sat on the mat .", "two dogs run in a park .", "he is happy now ."]
    ]
    plain = clf.predict(rows)
    clf.temperature = 3.0
    calibrated = clf.predict(rows)
    assert [r["label"] for r in calibrated] == [r["label"] for r in plain]
    assert len({tuple(r["label"]) for r in plain}) > 1  # the decisions differ between rows: a real check
    for a, b in zip(plain, calibrated):
        assert a["scores"] != b["scores"]
    assert clf.raw_outputs([]).numel() == 0

    # calibrate does not fit one temperature over labels each decided by its own threshold
    from gpt_ft.eval import calibration

    monkeypatch.setattr(calibration.Checkpoint, "read", lambda path: None)
    monkeypatch.setattr(calibration.Classifier, "from_checkpoint", lambda stored, device: clf)
    with pytest.raises(
        ValueError, match="Task 'm' decides each label on its own sigmoid against the card's threshold"
    ):
        calibration.calibrate(ckpt_path=str(tmp_path / "m.ckpt"), output=str(tmp_path / "c.ckpt"))


def test_progress_in_a_log_is_a_line_now_and_then(capsys, monkeypatch):
    """Where stderr is no terminal (a log, a pipe), `label`, `embed` and `generate` said nothing
    between their start and their last line: a long run now says how far it got, every 30 s."""
    from gpt_ft.eval import progress

    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False)
    assert list(progress.batches_bar("label", every=0)(range(3))) == [0, 1, 2]
    assert capsys.readouterr().err.splitlines() == [
        "label: 1 of 3 batches (33%) in 0 s",
        "label: 2 of 3 batches (67%) in 0 s",
    ]
    assert list(progress.batches_bar("label")(range(3))) == [0, 1, 2] and capsys.readouterr().err == ""


def test_a_long_file_is_labelled_a_chunk_at_a_time(finetuned, tmp_path, monkeypatch, capsys):
    """`gpt-ft label` holds a chunk's examples at a time (whole batches), writes every row in order
    in each format, and names a bad row of the last chunk before the model runs any."""
    import json

    from gpt_ft.eval import labelling

    monkeypatch.setattr(labelling, "CHUNK", 3)  # batches of 2: chunks of 4 rows
    runs = []
    run_encoded = Classifier.run_encoded
    monkeypatch.setattr(
        Classifier,
        "run_encoded",
        lambda self, encoded, **kw: runs.append(len(encoded)) or run_encoded(self, encoded, **kw),
    )
    sentences = [f"{GOOD[i % len(GOOD)]} {'.' * i}" for i in range(10)]
    rows = [{"sentence": s, "n": i} for i, s in enumerate(sentences)]
    expected = Classifier.from_checkpoint(finetuned.ckpt, device="cpu").predict(rows)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for output in ("out.jsonl", "out.json", "out.tsv", "out.csv", "out.parquet"):
        runs.clear()
        main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={tmp_path / output}",
              "--batch_size=2"])  # fmt: skip
        assert runs == [4, 4, 2]
        written = read_table(tmp_path / output).to_list()
        assert [(r["sentence"], str(r["n"]), r["prediction"]) for r in written] == [
            (r["sentence"], str(r["n"]), e["label"]) for r, e in zip(rows, expected)
        ]
        if output != "out.tsv" and output != "out.csv":
            scores = [list(r["scores"].values()) for r in written]
            assert scores == [pytest.approx(list(e["scores"].values()), abs=1e-6) for e in expected]
    assert (tmp_path / "out.json").read_text() == json.dumps(
        json.loads((tmp_path / "out.json").read_text()), ensure_ascii=False, indent=1
    ) + "\n"  # one array, laid out as json.dumps lays out the whole
    before = (tmp_path / "out.jsonl").read_bytes()
    source.write_text(source.read_text() + '{"text": "no sentence"}\n')
    runs.clear()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}",
              f"--output={tmp_path / 'out.jsonl'}", "--overwrite=true", "--batch_size=2"])  # fmt: skip
    assert f"{source}, line 11 has no field 'sentence'" in capsys.readouterr().err
    assert runs == [] and (tmp_path / "out.jsonl").read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_labelled_json_is_written_as_one_array_a_record_at_a_time(tmp_path):
    import json

    from gpt_ft.eval.labelling import labelled_file

    rows = [{"a": "x\ny", "b": [1, {"c": {}}]}, {"a": "é", "b": []}, {"a": None, "b": {"d": [2]}}]
    outcomes = [({"label": "p", "scores": {"p": 0.5, "q": 0.5}}, "p")] * 3
    with labelled_file(tmp_path / "o.json", ["a", "b"]) as out:
        out.write(rows[:2], outcomes[:2])
        out.write(rows[2:], outcomes[2:])
    records = [{**r, "prediction": "p", "scores": {"p": 0.5, "q": 0.5}} for r in rows]
    assert (tmp_path / "o.json").read_text() == json.dumps(records, ensure_ascii=False, indent=1) + "\n"
    with labelled_file(tmp_path / "none.json", ["a"]):
        pass
    assert (tmp_path / "none.json").read_text() == "[]\n"


def test_a_checkpoint_reached_through_a_link_reads_the_tokenizer_beside_its_file(finetuned, tmp_path):
    """`best.ckpt -> .../best-3-120.ckpt` elsewhere: the tokenizer saved beside the file itself, not
    sought beside the link (where none is)."""
    link = tmp_path / "model.ckpt"
    link.symlink_to(finetuned.ckpt)
    examples = [{"sentence": GOOD}, {"sentence": BAD}]
    linked, real = (Classifier.from_checkpoint(p).predict(examples) for p in (link, finetuned.ckpt))
    assert linked == real
    (tmp_path / "in.csv").write_text(f"sentence\n{GOOD}\n")
    out = tmp_path / "out.csv"
    main(["label", f"--ckpt_path={link}", f"--input={tmp_path / 'in.csv'}", f"--output={out}"])
    (row,) = csv.DictReader(out.read_text().splitlines())
    assert row["sentence"] == GOOD and row["prediction"] == real[0]["label"]
    assert out.read_bytes() == f"sentence,prediction\n{GOOD},{real[0]['label']}\n".encode()  # (was \r\n)


def test_a_bad_row_of_a_file_without_lines_is_named_by_its_record(finetuned, tmp_path, capsys):
    """A parquet file has no lines: `gpt-ft label` and `gpt-ft embed`'s reader name its bad row as
    `fit` does, by its record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpt_ft.eval.encoder import read_texts

    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"sentence": [["a"], ["b"]], "n": [1, 2]}), source)
    with pytest.raises(SystemExit):
        main(
            [
                "label",
                f"--ckpt_path={finetuned.ckpt}",
                f"--input={source}",
                f"--output={tmp_path / 'o.jsonl'}",
            ]
        )
    assert f"{source}, record 1: field 'sentence' holds a list" in capsys.readouterr().err
    with pytest.raises(TaskDataError, match=r"in.parquet, record 1: field 'sentence' holds a list"):
        read_texts(source, "sentence")


def test_an_escaped_lone_surrogate_in_a_json_array_is_named_by_its_line(finetuned, tmp_path, capsys):
    """`"\\ud800"` is no text: the table reading a JSON array drops it, Python's json keeps it; `gpt-ft
    label` names its line before the model runs (as a JSON-lines file's reader does), any field."""
    before = b"kept"
    (tmp_path / "o.jsonl").write_bytes(before)
    for i, record in enumerate(['{"sentence": "two", "note": "x\\ud800y"}', '{"sentence": "cat \\ud800."}']):
        source = tmp_path / f"s{i}.json"
        source.write_text(f'[{{"sentence": "the cat ."}},\n {record}]')
        with pytest.raises(SystemExit):
            main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}",
                  f"--output={tmp_path / 'o.jsonl'}", "--overwrite=true"])  # fmt: skip
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"gpt-ft: error: {source}, line 2: \\ud800 escapes half of a UTF-16 surrogate pair alone, "
            "which is no text; escape the whole pair, or write the character."
        )
        assert (tmp_path / "o.jsonl").read_bytes() == before


def test_arc_reads_nested_fields_and_answers_by_each_rows_names(tokenizer_dir, tmp_path, capsys):
    """tasks/arc_challenge.yaml on its hub layout (`choices.text`, `choices.label`): a row's label is
    one of its own names (A to E, or 1 to 4), and `predict`, `Classifier` and `label` name the
    chosen answer as the row does, each agreeing with the others."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.helpers import MICRO, TASKS, data_args

    def row(id, key, *names):
        texts = ["Heat.", "Light.", "Sound.", "A wave.", "Wind."][: len(names)]
        return {"id": id, "question": f"Which is {id}?", "choices": {"text": texts, "label": list(names)},
                "answerKey": key}  # fmt: skip

    rows = {
        "train": [row("M_1", "C", *"ABCD"), row("M_2", "2", *"123"), row("M_3", "E", *"ABCDE")],
        "validation": [row("M_5", "B", *"ABCD"), row("M_6", "1", *"1234")],
        "test": [row("Mercury_7", "D", *"ABCD"), row("Mercury_8", "3", *"123")],
    }  # fmt: skip
    for split, records in rows.items():
        path = tmp_path / f"ai2_arc/ARC-Challenge/{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(records), path)
    card = TASKS / "arc_challenge.yaml"
    data = data_args(task=card, tokenizer=tokenizer_dir, data_dir=tmp_path, batch_size=2, max_length=64)
    quiet = [
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
    ]
    main(["fit", data, "--model.preset=gpt-micro", f"--model.overrides={MICRO}", "--trainer.max_epochs=1",
          "--trainer.enable_model_summary=false", "--seed_everything=1", *quiet])  # fmt: skip
    ckpt = next(tmp_path.rglob("last.ckpt"))
    main(["predict", f"--ckpt_path={ckpt}", f"--model.predictions_dir={tmp_path / 'pred'}", *quiet])
    written = [
        line.split("\t") for line in (tmp_path / "pred/arc_challenge-test.tsv").read_text().splitlines()
    ]
    assert written[0] == ["index", "prediction"] and [r[0] for r in written[1:]] == ["Mercury_7", "Mercury_8"]
    assert written[1][1] in "ABCD" and written[2][1] in "123"  # the row's own names
    clf = Classifier.from_checkpoint(ckpt, device="cpu")
    outcomes = clf.predict(rows["test"])
    assert [list(o["scores"]) for o in outcomes] == [list("ABCD"), list("123")]
    assert [o["label"] for o in outcomes] == [r[1] for r in written[1:]]
    source = tmp_path / "mine.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows["test"]))
    main(["label", f"--ckpt_path={ckpt}", f"--input={source}", f"--output={tmp_path / 'out.jsonl'}"])
    labelled = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in labelled] == [o["label"] for o in outcomes]
    assert labelled[0]["choices"] == rows["test"][0]["choices"]  # the record as written, nested
    scored = labelled_rows(clf.task, "validation", tmp_path)  # zero-shot scoring's rows
    assert [clf.task.context_and_choices(r)[1] for r in scored] == [
        r["choices"]["text"] for r in rows["validation"]
    ]
    assert [clf.task.output.example_label(r) for r in scored] == [1, 0]
    capsys.readouterr()
    main(["validate", f"--ckpt_path={ckpt}", *quiet])  # the labels read by each row's names
    assert any(
        line.startswith("validate: validation/accuracy") for line in capsys.readouterr().out.splitlines()
    )
