"""Local files as each task card reads them: every card under tasks/ reads tiny fixtures written in its
task's native local format; slices, formats and file errors of `load_split`.

Offline: the fixtures are hand-written in tmp_path (GLUE's traps included: an unbalanced `"` in a
TSV sentence, MRPC's BOM, headerless CoLA train/dev, unlabelled test files with an `index` column).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re

import datasets
import numpy
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from jsonargparse import ArgumentParser

from gpt_ft.adapters import LocalFiles, SingleText, TaskDataError
from gpt_ft.adapters.cards import load_card
from gpt_ft.data.batches import reads
from gpt_ft.data.files import labelled_rows, load_split, located_split, read_table
from gpt_ft.data.layout import SLICE, split_file
from gpt_ft.data.task_data import TaskDataModule
from tests.helpers import TASK_CARDS, TASKS

CARDS = TASK_CARDS

NAN = math.nan
Q = 'He said "hi to the cat.'  # an unbalanced quote: with CSV quoting it would swallow the next rows


def tsv(*rows) -> str:
    return "".join("\t".join(map(str, row)) + "\n" for row in rows)


def csvs(*rows) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def jsonl(*rows) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def parquet(*rows: dict) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(list(rows)), sink)
    return sink.getvalue()


def dialogue(start: str, reply: str) -> str:
    return f"{start}\n\nAssistant: {reply}"


def messages(question: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


HH_HELD_OUT = jsonl({"chosen": dialogue("Hi?", "Hello."), "rejected": dialogue("Hi?", "Go away.")})
UF_HELD_OUT = parquet(
    {"prompt": "Hi?", "chosen": messages("Hi?", "Hello."), "rejected": messages("Hi?", "No.")}
)


# Headers of the GLUE files (standard download script).
STSB = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
MNLI = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse"]
MNLI += ["sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]
MRPC = ["#1 ID", "#2 ID", "#1 String", "#2 String"]
STORY = ["InputStoryid", *(f"InputSentence{i}" for i in range(1, 5))]
STORY += ["RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2", "AnswerRightEnding"]
SWAG = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source"]
SWAG += ["ending0", "ending1", "ending2", "ending3"]


def emotions(*ids: int) -> list[int]:
    """GoEmotions' 28 labels as a 0/1 row."""
    return [int(i in ids) for i in range(28)]


def mnli_row(i, a, b, *labels):
    return [i, 1, f"{i}e", "fiction", "(a)", "(b)", "(S a)", "(S b)", a, b, *labels]


def snli_row(a, b, gold):
    return {"annotator_labels": [gold], "captionID": "c1", "gold_label": gold, "pairID": "p1",
            "sentence1": a, "sentence1_parse": "(ROOT)", "sentence2": b}  # fmt: skip


def race_row(answer, question="Who sat?"):
    return {"example_id": "high1.txt", "article": Q, "question": question,
            "options": ["The cat.", "A dog.", "The man.", "Nobody."], "answer": answer}  # fmt: skip


def story_row(i, right):
    return [f"id-{i}", Q, "It sat.", "A dog ran, fast.", "It is a park.", "He is happy.", "He is sad.", right]


def hellaswag_row(ind, *label):
    """A record of the release files (rowanz/hellaswag data/): the test file's have no label."""
    row = {"ind": ind, "activity_label": "Sitting", "ctx_a": Q, "ctx_b": "he", "ctx": f"{Q} he",
           "split": "val", "split_type": "indomain", "endings": ["runs.", "eats.", "sleeps.", 'says "hi".'],
           "source_id": "activitynet~v_1"}  # fmt: skip
    return {**row, **({"label": label[0]} if label else {})}


def wic_row(idx, *label):
    """A record of SuperGLUE's WiC files (its `word` is the quote-holding text the test looks for)."""
    row = {"word": Q, "sentence1": "Go to the bank.", "sentence2": "The river bank.", "idx": idx,
           "start1": 10, "end1": 14, "start2": 10, "end2": 14, "version": 1.1}  # fmt: skip
    return {**row, **({"label": label[0]} if label else {})}


def wsc_row(idx, *label):
    """A record of SuperGLUE's WSC files: the spans a nested record (`target`)."""
    target = {"span1_index": 0, "span1_text": "The cat", "span2_index": 9, "span2_text": "it"}
    return {"text": f"{Q} It sat.", "target": target, "idx": idx, **({"label": label[0]} if label else {})}


def multirc_row(idx, *labels):
    """A record of SuperGLUE's MultiRC files: a passage, its questions and their answers nested in it
    (two questions of two answers and one; the test file's answers have no label)."""
    answers = [["The cat.", "A dog."], ["Nobody."]]
    verdicts = iter(labels)
    questions = [
        {"question": f"Who {q}?", "idx": 2 * idx + q,
         "answers": [{"text": text, "idx": k, **({"label": next(verdicts)} if labels else {})}
                     for k, text in enumerate(texts)]}
        for q, texts in enumerate(answers)
    ]  # fmt: skip
    return {"idx": idx, "version": 1.1, "passage": {"text": f"{Q} It sat.", "questions": questions}}


CLOZE_ANN = [1.0, 0.0] + [NAN] * 126 + [1.0, 0.0] + [NAN] * 126  # ReCoRD's labels (max_candidates 128)
CLOZE_BOB = [0.0, 1.0] + [NAN] * 126 + [0.0, 1.0] + [NAN] * 126


def record_row(idx, *answers):
    """A record of SuperGLUE's ReCoRD files: a passage with its entities as spans (`end` the last
    character's index) and its query (the test file's without answers)."""
    text = f"{Q} Bob met Ann.\n@highlight\nAnn left"
    entities = [{"start": text.index(e), "end": text.index(e) + len(e) - 1} for e in ("Bob", "Ann", "Bob")]
    qa = {
        "query": "@placeholder waved.",
        "idx": idx,
        **({"answers": [{"text": a} for a in answers]} if answers else {}),
    }
    return {"idx": idx, "passage": {"text": text, "entities": entities}, "qas": [qa]}


def siqa_row():
    """A record of Social IQa's release files: its labels are in a file of their own."""
    return {
        "context": Q,
        "question": "How would Ann feel?",
        "answerA": "glad",
        "answerB": "sad",
        "answerC": "calm",
    }


def arc_row(id, key, *names, stem="question"):
    """A record of the hub's parquet files (ARC, OpenBookQA, CommonsenseQA): each row names its own
    choices, A to E or (some ARC rows) 1 to 4; `key` the right one's name ("": unlabelled)."""
    texts = ["Heat.", "Light.", "Sound.", 'A "wave".', "Wind."][: len(names)]
    return {"id": id, stem: Q, "choices": {"text": texts, "label": list(names)}, "answerKey": key}


def winogrande_row(qid, *answer):
    """A record of the release files (winogrande_1.1/): the test file's have no answer."""
    row = {"qID": qid, "sentence": f"{Q} The _ left.", "option1": "cat", "option2": "man"}
    return {**row, **({"answer": answer[0]} if answer else {})}


def copa_row(idx, question, *label):
    """A record of the SuperGLUE release files (COPA/): the test file's have no label."""
    row = {
        "premise": f"{Q} It rained.",
        "choice1": "The sun shone.",
        "choice2": "I got wet.",
        "question": question,
    }
    return {**row, **({"label": label[0]} if label else {}), "idx": idx}


def swag_row(i, *label):
    return [i, "v1", 5, f"{Q} He", Q, "He", "gold", "runs.", "eats.", "sleeps.", 'says "hi".', *label]


STORY_VAL = csvs(STORY, *(story_row(i, 1 + i % 2) for i in range(1871)))  # the 2016 val file's size
# scikit-learn's train_test_split(range(1871), test_size=374, random_state=3535999445): GPT-1's split
GPT1_VALIDATION_STARTS, GPT1_TRAIN_STARTS = (
    [1058, 198, 1174, 806, 127, 918],
    [187, 1591, 1646, 169, 1870, 1416],
)
PAIR = ["index", "sentence1", "sentence2"]
AB = [["A.", "B."], ["C.", "D."]]


def gpt1_story_cloze_rows() -> tuple[list[int], list[int]]:
    """The val file's rows GPT-1 trained and validated on, in its order (sklearn's ShuffleSplit:
    a RandomState(seed) permutation, test rows first), checked against sklearn's first rows."""
    order = [int(i) for i in numpy.random.RandomState(3535999445).permutation(1871)]
    assert order[:6] == GPT1_VALIDATION_STARTS and order[374:380] == GPT1_TRAIN_STARTS
    return order[374:], order[:374]


def glue_test(header, rows, make=None):
    """An unlabelled GLUE test file: `index` 10, 11, ... then each row's cells (through `make`)."""
    lines = [make(10 + i, *cells) if make else [10 + i, *cells] for i, cells in enumerate(rows)]
    return tsv(header, *lines), [None] * len(rows), {"index": [10 + i for i in range(len(rows))]}


# card -> split -> (file contents in the task's native format, expected label ids (None: unlabelled),
# optional {"index": expected index values}). The file path is the card's own `local.splits` entry.
def steps(width: int, *labels: float) -> list[float]:
    """A solution's step labels as encoded: padded with NaN to the card's max_steps."""
    return [*labels, *[NAN] * (width - len(labels))]


def prm_row(question: str, error_steps: list[int], modified: list[str] | None = None) -> dict:
    process = ["1. Let x be 2.", "2. Then 2x is 4.", "3. So the answer is 4."]
    wrong = modified or ["1. Let x be 2.", "2. Then 2x is 5.", "3. So the answer is 5."]
    return {"modified_question": question, "modified_process": wrong, "error_steps": error_steps,
            "original_question": question, "original_process": process}  # fmt: skip


def pb_row(i: int, problem: str, label: int) -> dict:
    return {"id": f"gsm8k-{i}", "problem": problem, "steps": ["Two.", "Four.", "Done."], "label": label}


def replies(width: int, *scores: float) -> list[float]:
    """A row's reply scores as encoded: padded with NaN to the card's max_replies."""
    return [*scores, *[NAN] * (width - len(scores))]


ULTRA_ROW = {
    "instruction": Q,
    "completions": [{"response": "Yes.", "overall_score": 7}, {"response": "No.", "overall_score": 3.5}],
}
ULTRA = jsonl(*[ULTRA_ROW] * 50)
SHEPHERD_ROW = {
    "input": f"{Q} Step 1: 2+2=4 ки\nStep 2: so 5 ки",
    "label": f"{Q} Step 1: 2+2=4 +\nStep 2: so 5 -",
}
SHEPHERD = jsonl(*[SHEPHERD_ROW] * 50)


FIXTURES = {
    "glue/cola": {
        "train": (tsv(["gj04", 1, "", Q], ["gj04", 0, "*", "Him go the park."]), [1, 0]),
        "validation": (tsv(["cj99", 1, "", "The cat sat."], ["cj99", 1, "", "A dog ran."]), [1, 1]),
        "test": glue_test(["index", "sentence"], [["It is."], ["Is it?"]]),
    },
    "glue/sst2": {
        "train": (tsv(["sentence", "label"], [Q, 1], ["a dull , lazy dog", 0]), [1, 0]),
        "validation": (tsv(["sentence", "label"], ["charming", 1], ["lazy", 0]), [1, 0]),
        "test": glue_test(["index", "sentence"], [["charming"], ["dull"]]),
    },
    "glue/mrpc": {  # train/dev start with a BOM
        "train": ("\ufeff" + tsv(["Quality", *MRPC], [1, 7, 8, Q, "He said hi."], [0, 5, 6, *AB[0]]), [1, 0]),
        "validation": ("\ufeff" + tsv(["Quality", *MRPC], [0, 1, 2, "A cat.", "A dog."]), [0]),
        "test": glue_test(["index", *MRPC], [[1, 2, *AB[0]], [3, 4, *AB[1]]]),
    },
    "glue/stsb": {
        "train": (tsv([*STSB, "score"], [0, "news", "f", 2012, 1, "s", "s", Q, "He said hi.", 3.8]), [3.8]),
        "validation": (tsv([*STSB, "score"], [0, "news", "f", 2012, 1, "s", "s", *AB[0], "0.000"]), [0.0]),
        "test": glue_test(STSB, [["n", "f", 1, 1, "s", "s", *ab] for ab in AB]),
    },
    "glue/qqp": {
        "train": (
            tsv(["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], [0, 1, 2, Q, "Is it?", 1]),
            [1],
        ),
        "validation": (
            tsv(
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], [5, 1, 2, "Why?", "How?", 0]
            ),
            [0],
        ),
        "test": glue_test(["id", "question1", "question2"], AB),
    },
    "glue/mnli": {
        "train": (
            tsv([*MNLI, "label1", "gold_label"], mnli_row(0, Q, "He spoke.", "neutral", "neutral")),
            [1],
        ),
        "validation_matched": (
            tsv(
                [*MNLI, *(f"label{i}" for i in range(1, 6)), "gold_label"],
                mnli_row(0, *AB[0], *["entailment"] * 6),
            ),
            [0],
        ),
        "validation_mismatched": (
            tsv(
                [*MNLI, *(f"label{i}" for i in range(1, 6)), "gold_label"],
                mnli_row(0, *AB[0], *["contradiction"] * 6),
            ),
            [2],
        ),
        "test_matched": glue_test(MNLI, AB, make=mnli_row),
        "test_mismatched": glue_test(MNLI, AB, make=mnli_row),
        "test_ax": glue_test(PAIR, AB),  # diagnostic/diagnostic.tsv: index, sentence1, sentence2
    },
    "glue/qnli": {
        "train": (
            tsv(
                ["index", "question", "sentence", "label"],
                [0, Q, "Hi.", "not_entailment"],
                [1, "Who?", "I.", "entailment"],
            ),
            [1, 0],
        ),
        "validation": (
            tsv(["index", "question", "sentence", "label"], [0, "Why?", "No.", "entailment"]),
            [0],
        ),
        "test": glue_test(["index", "question", "sentence"], AB),
    },
    "glue/rte": {
        "train": (
            tsv([*PAIR, "label"], [0, Q, "He spoke.", "entailment"], [1, *AB[0], "not_entailment"]),
            [0, 1],
        ),
        "validation": (tsv([*PAIR, "label"], [0, *AB[0], "not_entailment"]), [1]),
        "test": glue_test(PAIR, AB),
    },
    "glue/wnli": {  # 0/1 digits, 1 = entailment
        "train": (tsv([*PAIR, "label"], [0, Q, "He spoke.", 1], [1, *AB[0], 0]), [1, 0]),
        "validation": (tsv([*PAIR, "label"], [0, *AB[0], 0]), [0]),
        "test": glue_test(PAIR, AB),
    },
    "snli": {  # rows whose gold_label is '-' (no consensus) are dropped
        "train": (
            jsonl(
                snli_row(Q, "He spoke.", "entailment"),
                snli_row(*AB[0], "-"),
                snli_row(*AB[1], "contradiction"),
            ),
            [0, 2],
        ),
        "validation": (jsonl(snli_row(*AB[0], "neutral"), snli_row(*AB[1], "-")), [1]),
        "test": (jsonl(snli_row(*AB[0], "contradiction"), snli_row(*AB[1], "neutral")), [2, 1]),
    },
    "scitail": {  # no header row
        "train": (tsv([Q, "He spoke.", "entails"], ["A cat.", "A dog.", "neutral"]), [0, 1]),
        "validation": (tsv([*AB[0], "neutral"]), [1]),
        "test": (tsv([*AB[0], "entails"], [*AB[1], "neutral"]), [0, 1]),
    },
    "storycloze": {  # the 2016 test file is labelled; the val file is cut 1497 / 374 as GPT-1 cut it
        "train": (STORY_VAL, [i % 2 for i in gpt1_story_cloze_rows()[0]]),
        "validation": (STORY_VAL, [i % 2 for i in gpt1_story_cloze_rows()[1]]),
        "test": (csvs(STORY, story_row(0, 2), story_row(1, 1)), [1, 0]),
    },
    "race": {
        "train": (jsonl(race_row("A"), race_row("D")), [0, 3]),
        "validation": (jsonl(race_row("B")), [1]),
        "test": (jsonl(race_row("C"), race_row("A", "Who ran?")), [2, 0]),
    },
    "go_emotions": {  # headerless TSVs: text, comma-joined label ids, comment id; an empty text: no label
        "train": (
            tsv([Q, "2,14", "eebbqej"], ["I love it", "18", "ed00q6i"]),
            [emotions(2, 14), emotions(18)],
        ),
        "validation": (tsv(["Thanks!", "15,27", "eczazk4"]), [emotions(15, 27)]),
        "test": (tsv(["ok then", "27", "ed4b0hs"], ["so what", "", "ee6pagw"]), [emotions(27), emotions()]),
    },
    "preference/hh_rlhf": {  # gzipped JSON lines of whole dialogues; validation and test: one file
        "train": (
            jsonl(
                {"chosen": dialogue(Q, "Yes."), "rejected": dialogue(Q, "No.")},
                {"chosen": dialogue("Why?", "Because."), "rejected": dialogue("Why?", "?")},
            ),
            [0.0, 0.0],
        ),  # fmt: skip
        "validation": (HH_HELD_OUT, [0.0]),
        "test": (HH_HELD_OUT, [0.0]),
    },
    "preference/ultrafeedback_binarized": {  # parquet, the replies as chat messages
        "train": (
            parquet({"prompt": Q, "chosen": messages(Q, "Yes."), "rejected": messages(Q, "No.")}),
            [0.0],
        ),
        "validation": (UF_HELD_OUT, [0.0]),
        "test": (UF_HELD_OUT, [0.0]),
    },
    "preference/pairs": {
        "train": (jsonl({"prompt": Q, "chosen": "Yes.", "rejected": "No."}), [0.0]),
        "validation": (jsonl({"prompt": "Hi?", "chosen": "Hello.", "rejected": "No."}), [0.0]),
        "test": (jsonl({"prompt": "Hi?", "chosen": "Hello.", "rejected": "Bye."}), [0.0]),
    },
    "embedding/stsb": {  # GLUE's STS-B files, as scored pairs
        "train": (tsv([*STSB, "score"], [0, "news", "f", 2012, 1, "s", "s", Q, "He said hi.", 3.8]), [3.8]),
        "validation": (tsv([*STSB, "score"], [0, "news", "f", 2012, 1, "s", "s", *AB[0], "0.000"]), [0.0]),
        "test": glue_test(STSB, [["n", "f", 1, 1, "s", "s", *ab] for ab in AB]),
    },
    "embedding/snli": {  # triplets: a premise's entailed hypothesis, and the one it contradicts
        "train": (
            jsonl(
                snli_row(Q, "He spoke.", "entailment"),
                snli_row(*AB[0], "-"),
                snli_row(Q, "He was silent.", "contradiction"),
                snli_row(*AB[1], "contradiction"),  # no entailment: no example
            ),
            [1.0],
        ),
        "validation": (jsonl(snli_row(*AB[0], "entailment"), snli_row(*AB[1], "entailment")), [1.0, 1.0]),
        "test": (jsonl(snli_row(*AB[0], "entailment")), [1.0]),
    },
    "embedding/mnli": {  # GLUE's MNLI files as triplets
        "train": (
            tsv(
                [*MNLI, "label1", "gold_label"],
                mnli_row(0, Q, "He spoke.", "entailment", "entailment"),
                mnli_row(1, Q, "He was silent.", "contradiction", "contradiction"),
            ),
            [1.0],
        ),
        "validation": (
            tsv([*MNLI, "label1", "gold_label"], mnli_row(0, *AB[0], "entailment", "entailment")),
            [1.0],
        ),
        "test": (
            tsv([*MNLI, "label1", "gold_label"], mnli_row(0, *AB[1], "entailment", "entailment")),
            [1.0],
        ),
    },
    "embedding/pairs": {  # no score: every pair a match; hard negatives optional
        "train": (jsonl({"anchor": Q, "positive": "Yes.", "negatives": ["No.", "Why?"]}), [1.0]),
        "validation": (jsonl({"anchor": "Hi?", "positive": "Hello."}), [1.0]),
        "test": (jsonl({"anchor": "Hi?", "positive": "Hello.", "negatives": []}), [1.0]),
    },
    "rerank/pairs": {  # the positive first
        "train": (jsonl({"query": Q, "positive": "Yes.", "negatives": ["No.", "Why?"]}), [0]),
        "validation": (jsonl({"query": "Hi?", "positive": "Hello.", "negatives": ["Bye."]}), [0]),
        "test": (jsonl({"query": "Hi?", "positive": "Hello.", "negatives": "Bye."}), [0]),
    },
    "steps/steps": {  # a label per step; null: none
        "train": (jsonl({"problem": Q, "steps": ["a.", "b."], "labels": [True, False]}), [steps(64, 1, 0)]),
        "validation": (jsonl({"problem": "Hi?", "steps": ["a."], "labels": ["-"]}), [steps(64, 0)]),
        "test": (
            jsonl({"problem": "Hi?", "steps": ["a.", "b."], "labels": [0.5, None]}),
            [steps(64, 0.5, NAN)],
        ),
    },
    "steps/prmbench": {  # the wrong steps, counted from 1
        "train": (jsonl(prm_row(Q, [2]), prm_row("Hi?", [])), [steps(128, 1, 0, 1), steps(128, 1, 1, 1)]),
        "validation": (jsonl(prm_row("Hi?", [1, 3])), [steps(128, 0, 1, 0)]),
        "test": (jsonl(prm_row("Hi?", [3])), [steps(128, 1, 1, 0)]),
    },
    "steps/processbench": {  # JSON lists; the first wrong step counted from 0, the rest unlabelled
        "gsm8k": (
            json.dumps([pb_row(0, Q, 1), pb_row(1, "Hi?", -1)]),
            [steps(128, 1, 0, NAN), steps(128, 1, 1, 1)],
        ),
        "math": (json.dumps([pb_row(0, "Hi?", 0)]), [steps(128, 0, NAN, NAN)]),
        "olympiadbench": (json.dumps([pb_row(0, "Hi?", 2)]), [steps(128, 1, 1, 0)]),
        "omnimath": (json.dumps([pb_row(0, "Hi?", -1)]), [steps(128, 1, 1, 1)]),
    },
    "steps/math_shepherd": {  # one file, 2% held out: 49 rows and 1
        "train": (SHEPHERD, [steps(64, 1, 0)] * 49),
        "validation": (SHEPHERD, [steps(64, 1, 0)]),
        "test": (SHEPHERD, [steps(64, 1, 0)]),
    },
    "ranking/replies": {  # scores, higher better; null: unranked
        "train": (
            jsonl({"prompt": Q, "replies": ["a", "b", "c"], "scores": [1, 3, None]}),
            [replies(4, 1, 3, NAN)],
        ),
        "validation": (jsonl({"prompt": "Hi?", "replies": ["a", "b"], "scores": [0, 2]}), [replies(4, 0, 2)]),
        "test": (jsonl({"prompt": "Hi?", "replies": ["a"]}), [None]),  # one reply to score
    },
    "ranking/rewardbench2": {  # one chosen against three rejected; a Ties row's kind and prompt
        "test": (
            jsonl(
                {"id": "7", "prompt": Q, "chosen": ["a"], "rejected": ["b", "c", "d"], "subset": "Math"},
                {"id": "tied:12", "prompt": Q, "chosen": ["a", "b"], "rejected": ["c"], "subset": "Ties"},
            ),
            [[*replies(64, 1, 0, 0, 0), 2.0, 0.0, 0.0], [*replies(64, 1, 1, 0), 5.0, 2.0, 12.0]],
        ),
    },
    "ranking/ultrafeedback": {  # one file, 2% held out: 49 rows and 1
        "train": (ULTRA, [replies(4, 7, 3.5)] * 49),
        "validation": (ULTRA, [replies(4, 7, 3.5)]),
        "test": (ULTRA, [replies(4, 7, 3.5)]),
    },
    "ranking/prmbench": {  # grouped by question: the original solution above its modified ones, each once
        "train": (
            jsonl(prm_row(Q, [2]), prm_row(Q, [3], modified=["1. Let x be 3.", "2. So 6."])),
            [replies(32, 1, 0, 0)],
        ),
        "validation": (jsonl(prm_row("Hi?", [1])), [replies(32, 1, 0)]),
        "test": (jsonl(prm_row("Hi?", [1])), [replies(32, 1, 0)]),
    },
    "boolq": {  # the answer a JSON boolean; no test split
        "train": (
            jsonl(*({"question": "is it?", "title": "T", "answer": a, "passage": Q} for a in (True, False))),
            [1, 0],
        ),  # fmt: skip
        "validation": (jsonl({"question": "is it?", "title": "T", "answer": False, "passage": Q}), [0]),
    },
    "hellaswag": {  # labels as numbers; the test file has none
        "train": (jsonl(hellaswag_row(4, 2), hellaswag_row(9, 0)), [2, 0], {"index": [4, 9]}),
        "validation": (jsonl(hellaswag_row(24, 3)), [3]),
        "test": (jsonl(hellaswag_row(7), hellaswag_row(8)), [None, None]),
    },
    **{
        f"arc_{level}": {  # rows of 4, 3 (named 1 to 3) and 5 choices: the answer by the row's names
            "train": (parquet(arc_row("M_1", "C", *"ABCD"), arc_row("M_2", "2", *"123")), [2, 1]),
            "validation": (parquet(arc_row("M_3", "E", *"ABCDE")), [4]),
            "test": (parquet(arc_row("M_4", "A", *"ABCD"), arc_row("M_5", "3", *"1234")), [0, 2]),
        }
        for level in ("challenge", "easy")
    },
    "openbookqa": {  # the question's field is question_stem
        "train": (
            parquet(*(arc_row(f"7-{i}", k, *"ABCD", stem="question_stem") for i, k in enumerate("DB"))),
            [3, 1],
        ),
        "validation": (parquet(arc_row("8-1", "A", *"ABCD", stem="question_stem")), [0]),
        "test": (parquet(arc_row("9-1", "B", *"ABCD", stem="question_stem")), [1]),
    },
    "commonsense_qa": {  # the test split's answerKey empty: unlabelled
        "train": (parquet(arc_row("075e", "E", *"ABCDE"), arc_row("61fe", "A", *"ABCDE")), [4, 0]),
        "validation": (parquet(arc_row("1afa", "B", *"ABCDE")), [1]),
        "test": (parquet(arc_row("90b3", "", *"ABCDE"), arc_row("0a4b", "", *"ABCDE")), [None, None]),
    },
    "mmlu": {  # answers 0 to 3 (the hub's class labels A to D); every split labelled
        "train": (
            parquet(
                *(
                    {"question": Q, "subject": "", "choices": ["1", "2", "3", "4"], "answer": a}
                    for a in (3, 0)
                )
            ),
            [3, 0],
        ),
        "validation": (
            parquet({"question": Q, "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 1}),
            [1],
        ),
        "test": (
            parquet({"question": Q, "subject": "virology", "choices": ["a", "b", "c", "d"], "answer": 2}),
            [2],
        ),
    },
    "winogrande": {  # "1" or "2"; the test file has no answers, its ids name the predictions
        "train": (jsonl(winogrande_row("3QH-1", "2"), winogrande_row("3QH-2", "1")), [1, 0]),
        "validation": (jsonl(winogrande_row("9AB-1", "1")), [0]),
        "test": (jsonl(winogrande_row("7XY-1"), winogrande_row("7XY-2")), [None, None]),
    },
    "superglue/cb": {  # names; the test file has no labels, its idx names the predictions
        "train": (
            jsonl(
                *(
                    {"premise": Q, "hypothesis": "So.", "label": g, "idx": i}
                    for i, g in enumerate(["neutral", "entailment"])
                )
            ),
            [2, 0],
            {"index": [0, 1]},
        ),
        "validation": (jsonl({"premise": Q, "hypothesis": "No.", "label": "contradiction", "idx": 0}), [1]),
        "test": (jsonl({"premise": Q, "hypothesis": "So.", "idx": 7}), [None], {"index": [7]}),
    },
    "superglue/wic": {  # JSON booleans; the word and the first sentence one text; the test file has no labels
        "train": (
            jsonl(*(wic_row(i, label) for i, label in enumerate([True, False]))),
            [1, 0],
            {"index": [0, 1]},
        ),
        "validation": (jsonl(wic_row(0, False)), [0]),
        "test": (jsonl(wic_row(5)), [None], {"index": [5]}),
    },
    "superglue/wsc": {  # JSON booleans; the pronoun and the noun one text; the test file has no labels
        "train": (jsonl(*(wsc_row(i, label) for i, label in enumerate([False, True]))), [0, 1]),
        "validation": (jsonl(wsc_row(0, True)), [1]),
        "test": (jsonl(wsc_row(3)), [None], {"index": [3]}),
    },
    "superglue/multirc": {  # a passage a record, a question an example; its answers' verdicts, NaN past them
        "train": (jsonl(multirc_row(0, 1, 0, 0)), [[1, 0] + [NAN] * 30, [0] + [NAN] * 31], {"index": [0, 1]}),
        "validation": (jsonl(multirc_row(0, 0, 1, 1)), [[0, 1] + [NAN] * 30, [1] + [NAN] * 31]),
        "test": (jsonl(multirc_row(4), multirc_row(5)), [None] * 4, {"index": [0, 1, 2, 3]}),
    },
    "superglue/record": {  # candidates Ann, Bob (sorted, once): each one's exact match, then its token F1
        "train": (
            jsonl(record_row(0, "Ann"), record_row(1, "bob")),
            [CLOZE_ANN, CLOZE_BOB],
            {"index": [0, 1]},
        ),
        "validation": (jsonl(record_row(0, "Bob", "the Bob")), [CLOZE_BOB]),
        "test": (jsonl(record_row(4)), [None], {"index": [4]}),  # the query's idx
    },
    "superglue/boolq": {  # JSON booleans; the test file has no labels
        "train": (
            jsonl(
                *(
                    {"question": "is it", "passage": Q, "idx": i, "label": v}
                    for i, v in enumerate([True, False])
                )
            ),
            [1, 0],
            {"index": [0, 1]},
        ),
        "validation": (jsonl({"question": "is it", "passage": Q, "idx": 0, "label": False}), [0]),
        "test": (jsonl({"question": "is it", "passage": Q, "idx": 9}), [None], {"index": [9]}),
    },
    "superglue/rte": {  # the test file has no labels
        "train": (
            jsonl(
                *(
                    {"premise": Q, "hypothesis": "A cat.", "idx": i, "label": v}
                    for i, v in enumerate(["not_entailment", "entailment"])
                )
            ),
            [1, 0],
        ),
        "validation": (jsonl({"premise": Q, "hypothesis": "A cat.", "idx": 0, "label": "entailment"}), [0]),
        "test": (jsonl({"premise": Q, "hypothesis": "A cat.", "idx": 3}), [None], {"index": [3]}),
        # the diagnostics: AX-b's pairs are sentence1 and sentence2, AX-g's premise and hypothesis
        "test_axb": (
            jsonl({"sentence1": Q, "sentence2": "A cat.", "idx": 7, "label": "entailment"}),
            [0],
            {"index": [7]},
        ),
        "test_axg": (
            jsonl({"premise": Q, "hypothesis": "He sat.", "idx": 5, "label": "not_entailment", "pair_id": 1}),
            [1],
            {"index": [5]},
        ),
    },
    "superglue/copa": {  # 0: choice1, 1: choice2; the test file has no labels
        "train": (jsonl(copa_row(0, "effect", 1), copa_row(1, "cause", 0)), [1, 0]),
        "validation": (jsonl(copa_row(0, "effect", 1)), [1]),
        "test": (jsonl(copa_row(3, "cause")), [None], {"index": [3]}),
    },
    "piqa": {  # the labels in files of their own (LABEL_FILES); the test file has none
        "train": (jsonl(*({"goal": Q, "sol1": "Pour it.", "sol2": "Stir it."} for _ in "ab")), [1, 0]),
        "validation": (jsonl({"goal": Q, "sol1": "Cut.", "sol2": "Fold."}), [0]),
        "test": (jsonl({"goal": Q, "sol1": "Cut.", "sol2": "Fold."}), [None]),
    },
    "social_iqa": {  # '1' to '3' in files of their own (LABEL_FILES); no test split
        "train": (jsonl(*(siqa_row() for _ in "abc")), [2, 0, 1]),
        "validation": (jsonl(siqa_row()), [1]),
    },
    "swag": {  # test has no label column
        "train": (csvs([*SWAG, "label"], swag_row(0, 2), swag_row(1, 0)), [2, 0]),
        "validation": (csvs([*SWAG, "label"], swag_row(0, 3)), [3]),
        "test": (csvs(SWAG, swag_row(0), swag_row(1)), [None, None]),
    },
}


# The labels of AI2's releases, one a line beside the records (the cards' `local.label_files`): a
# blank last line is read as none.
LABEL_FILES = {
    "piqa": {"train": "1\n0\n", "validation": "0\n\n"},
    "social_iqa": {"train": "3\n1\n2", "validation": "2\n"},
}


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Keep datasets' Arrow cache of the fixtures out of the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


@pytest.mark.parametrize("card", CARDS)
def test_card_reads_native_files(card, tokenizer_dir, tmp_path):
    assert card in FIXTURES, f"add a fixture for the new card tasks/{card}.yaml to FIXTURES"
    fixture = FIXTURES[card]
    parser = ArgumentParser()
    parser.add_class_arguments(TaskDataModule, "data", sub_configs=True)
    cfg = parser.parse_args(
        [f"--data.task={TASKS / card}.yaml", f"--data.tokenizer={tokenizer_dir}"]
        + [f"--data.data_dir={tmp_path}", "--data.max_length=64"]
    )
    dm = parser.instantiate(cfg).data
    task = dm.task
    assert set(fixture) == set(task.local.splits)
    for split, (text, *_) in fixture.items():
        path = tmp_path / SLICE.match(task.local.splits[split])["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    assert set(LABEL_FILES.get(card, {})) == set(task.local.label_files or {})
    for split, labels in LABEL_FILES.get(card, {}).items():
        (tmp_path / task.local.label_files[split]).write_text(labels)

    specials = dm.special_ids
    for split, (_, labels, *extra) in fixture.items():
        ds = dm.encoded(split, labelled=False)
        assert len(ds) == len(labels), split
        got = ds["label"]
        if task.output.embeds:  # the gold score, then which text each one is
            got = [task.output.label_text(label) for label in got]
        if task.output.kind in ("steps", "ranking", "answers", "cloze") and None not in got:  # NaN: none
            torch.testing.assert_close(
                torch.tensor(got), torch.tensor(labels), rtol=0, atol=0, equal_nan=True
            )
        elif task.regression:
            assert got == pytest.approx(labels), split
        else:
            assert got == labels, split
        if split in task.test_splits and card.startswith("glue/"):
            assert all(label is None for label in got)  # GLUE test files carry no labels
        if extra:
            assert ds["index"] == extra[0]["index"], split
        for example in ds:
            # the most a row has: rows of fewer hard negatives have fewer
            assert 1 <= len(example["input_ids"]) <= task.num_sequences
            read = reads(example)  # one extract token a sequence, or one a step
            for s, ids in enumerate(example["input_ids"]):
                at = [k for of, k in read if of == s]
                assert ids[0] == specials.start and at[-1] == len(ids) - 1
                assert [ids[k] for k in at] == [specials.extract] * len(at)
            if task.output.kind == "steps":  # every step's extract token in the one sequence
                assert ids.count(specials.extract) == len(at) == len(example["extract_index"]) >= 1

    # The quote-holding text of train's first row survives intact (no quoting ate the row or its tab).
    first = "train" if "train" in fixture else task.validation_splits[0]  # an evaluation set: no train
    shown = dm.explain(first, 0)
    ids = shown["sequences"][0]["ids"]
    end = ids.index(specials.delim) if specials.delim in ids else shown["sequences"][0]["extract_index"]
    text = dm.tokenizer.decode(ids[1:end])
    if not text:  # no problem field: the first step holds it (Math-Shepherd)
        text = dm.tokenizer.decode(ids[end + 1 : ids.index(specials.extract)])
    assert text.removeprefix("\n\nUser: ").startswith(Q)  # messages: the role first
    if task.output.class_names:
        assert shown["label"] == task.labels[fixture[first][1][0]]


def test_a_label_column_numbering_the_cards_classes_in_another_order_is_refused(tmp_path):
    """A parquet file datasets wrote (or a hub dataset) keeps its classes' names with its ids: in
    another order than the card's labels, every id was read as the other class, silently."""
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["positive", "negative"])})  # fmt: skip
    rows = {"sentence": ["great", "awful"], "label": [0, 1]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(tmp_path / "t.parquet")
    local = LocalFiles(splits={"train": "t.parquet"})
    swapped = SingleText(name="s", labels=["negative", "positive"], local=local)
    with pytest.raises(TaskDataError) as error:
        load_split(swapped, "train", tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 't.parquet'}: its column 'label' numbers its classes ['positive', 'negative'], the "
        "card's labels are ['negative', 'positive']: list the card's labels in the file's order."
    )
    for labels in (["positive", "negative"], ["good", "bad"]):  # its order, or names of the card's own
        task = SingleText(name="s", labels=labels, local=local)
        assert [task.output.example_label(r) for r in load_split(task, "train", tmp_path)] == [0, 1]


def test_slices_formats_and_file_errors(tmp_path):
    lines = "".join(f"{i}\tsentence {i}\t{i % 2}\n" for i in range(5))
    (tmp_path / "all.tsv").write_text("idx\tsentence\tlabel\n" + lines)
    (tmp_path / "notes.txt").write_text("sentence\n")
    splits = {"train": "all.tsv[:3]", "validation": "all.tsv[3:]", "test": "notes.txt"}
    task = SingleText(name="s", labels=["a", "b"], local=LocalFiles(splits=splits, columns={"idx": "index"}))
    assert SLICE.match("all.tsv[:3]").group("file", "slice") == ("all.tsv", "[:3]")
    assert SLICE.match("dir/all.tsv").group("file", "slice") == ("dir/all.tsv", None)
    assert split_file(task, "train", tmp_path) == tmp_path / "all.tsv"
    train, validation = load_split(task, "train", tmp_path), load_split(task, "validation", tmp_path)
    assert train["index"] == ["0", "1", "2"] and validation["sentence"] == ["sentence 3", "sentence 4"]
    assert set(train.column_names) == {"index", "sentence", "label"}  # idx renamed, all read as text
    with pytest.raises(TaskDataError, match=r"notes.txt: unknown file format; set `format`"):
        load_split(task, "test", tmp_path)
    with pytest.raises(
        TaskDataError, match=r"Task 's' has no hub dataset; pass its files with --data.data_dir"
    ):
        load_split(task, "train", None)


def test_story_cloze_is_split_as_gpt1_split_it(tmp_path):
    """GPT-1's code split the 2016 val file with scikit-learn's train_test_split (374 to validate,
    seed 3535999445); the card's shuffle_seed draws the same rows in the same order, and a row's
    place in the file is still named by its line."""
    from gpt_ft.adapters.cards import load_card

    task = load_card(TASKS / "storycloze.yaml")
    (tmp_path / SLICE.match(task.local.splits["train"])["file"]).write_text(STORY_VAL)
    train, validation = (
        list(load_split(task, split, tmp_path)["InputStoryid"]) for split in ("train", "validation")
    )
    assert (len(train), len(validation)) == (1497, 374)
    assert validation[:6] == [f"id-{i}" for i in GPT1_VALIDATION_STARTS]
    assert train[:6] == [f"id-{i}" for i in GPT1_TRAIN_STARTS]
    assert sorted(train + validation) == sorted(f"id-{i}" for i in range(1871))
    origin = located_split(task, "validation", tmp_path)[1]
    assert (
        origin.of(1) == f"{tmp_path / SLICE.match(task.local.splits['train'])['file']}, line 200"
    )  # row 198
    sklearn = pytest.importorskip("sklearn.model_selection")
    rows, held_out = sklearn.train_test_split(list(range(1871)), test_size=374, random_state=3535999445)
    assert (train, validation) == ([f"id-{i}" for i in rows], [f"id-{i}" for i in held_out])


def test_a_missing_test_file_says_how_to_predict_the_others(tmp_path):
    """GLUE's MNLI without its diagnostic file (fetched apart): the message gives the option that
    leaves that split out; a card's only test split has no others to name."""
    (tmp_path / "m.tsv").write_text("idx\tsentence\n0\ta cat .\n")
    splits = {"train": "m.tsv", "test_matched": "m.tsv", "test_ax": "ax.tsv", "test_mm": "m.tsv"}
    task = SingleText(name="mnli", labels=["a", "b"], local=LocalFiles(splits=splits),
                      test_splits=["test_matched", "test_ax", "test_mm"])  # fmt: skip
    with pytest.raises(TaskDataError) as missing:
        load_split(task, "test_ax", tmp_path)
    assert str(missing.value) == (
        f"{tmp_path / 'ax.tsv'}: file not found (split 'test_ax' of task 'mnli'); the others alone: "
        "--data.task.init_args.test_splits '[test_matched, test_mm]'."
    )
    task = SingleText(name="mnli", labels=["a", "b"], local=task.local, test_splits=["test_ax"])
    with pytest.raises(TaskDataError, match=r"\(split 'test_ax' of task 'mnli'\)\.$"):
        load_split(task, "test_ax", tmp_path)
    # Two of three missing (SuperGLUE's RTE without AX-b and AX-g): the one whose file is there.
    splits = {**splits, "test_mm": "mm.tsv"}
    task = SingleText(name="mnli", labels=["a", "b"], local=LocalFiles(splits=splits),
                      test_splits=["test_matched", "test_ax", "test_mm"])  # fmt: skip
    with pytest.raises(TaskDataError, match=r"; the others alone: --data.task.init_args.test_splits "
                       r"'\[test_matched\]'\.$"):  # fmt: skip
        load_split(task, "test_ax", tmp_path)


@pytest.mark.parametrize("card", ["steps/prmbench", "ranking/prmbench", "race"])
def test_a_missing_file_that_a_command_writes_names_the_command(card, tmp_path):
    """PRMBench's files split by question are written by a benchmark script, RACE's as the hub's rows:
    a missing one said "file not found" alone (RACE's docs put it among the releases read as they are)."""
    task = load_card(TASKS / f"{card}.yaml")
    with pytest.raises(TaskDataError) as missing:
        load_split(task, "train", tmp_path)
    assert str(missing.value) == (
        f"{tmp_path / task.local.splits['train']}: file not found (split 'train' of task '{task.name}'); "
        f"the task's files are written by {task.local.written_by}."
    )


def test_the_command_that_writes_races_files_writes_what_its_card_reads(tmp_path, monkeypatch):
    """The card's command, run where the hub is reached (here: its rows as ehovy/race holds them)."""
    command = load_card(TASKS / "race.yaml").local.written_by
    code = re.fullmatch(r'python -c "(.*)", online', command)[1].replace("DIR", str(tmp_path))
    row = {"example_id": "high1.txt", "article": "A cat sat .", "answer": "C", "question": "Where ?",
           "options": ["here", "there", "on a mat", "away"]}  # fmt: skip
    hub = datasets.DatasetDict(
        {s: datasets.Dataset.from_list([row]) for s in ("train", "validation", "test")}
    )
    with monkeypatch.context() as online:
        online.setattr(datasets, "load_dataset", lambda *args: hub if args == ("ehovy/race", "all") else None)
        exec(code, {})
    task = load_card(TASKS / "race.yaml")
    for split in ("train", "validation", "test"):
        (read,) = labelled_rows(task, split, tmp_path)
        assert task.output.example_label(read) == 2 and read["options"][2] == "on a mat", split


def test_columns_renamed_onto_a_kept_column_or_each_other_are_one_sentence(tmp_path):
    """datasets said `Field "sentence" exists 2 times in schema`, naming no file nor card field."""
    (tmp_path / "t.tsv").write_text("text\tsentence\tlabel\na\tb\t0\n")
    for columns, message in (
        ({"text": "sentence"}, "renames 'text' to 'sentence', but its column 'sentence' is kept"),
        ({"text": "body", "label": "body"}, "renames 'text' to 'body', but 'label' is renamed to it too"),
    ):
        task = SingleText(
            name="s", labels=["0", "1"], local=LocalFiles(splits={"train": "t.tsv"}, columns=columns)
        )
        with pytest.raises(TaskDataError, match=rf"^\S+t.tsv: `columns` {message}; give each its own name.$"):
            load_split(task, "train", tmp_path)


def test_a_file_read_for_itself_with_no_rows_says_so(tmp_path):
    """`gpt-ft label` on a header alone: not "split 'data' has no examples", a split it never named."""
    from gpt_ft.data.files import read_table

    (tmp_path / "h.tsv").write_text("sentence\n")
    with pytest.raises(TaskDataError, match=r"^\S+h.tsv holds no rows.$"):
        read_table(tmp_path / "h.tsv")
    for name in ("e.csv", "e.tsv", "e.json", "e.jsonl", "e.parquet"):  # empty: each reader said it its way
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(TaskDataError, match=rf"^\S+{name} holds no rows.$"):
            read_table(tmp_path / name)
    (tmp_path / "e.jsonl.gz").write_bytes(gzip.compress(b""))  # empty once gunzipped
    pq.write_table(pa.table({"sentence": pa.array([], pa.string())}), tmp_path / "z.parquet")  # 0 rows
    for name in ("e.jsonl.gz", "z.parquet"):
        with pytest.raises(TaskDataError, match=rf"^\S+{name} holds no rows.$"):
            read_table(tmp_path / name)
        with pytest.raises(TaskDataError, match=rf"^\S+{name}: split 'train' has no examples.$"):
            read_table(tmp_path / name, split="train")


def test_a_cell_longer_than_pythons_csv_field_limit_is_read(tmp_path):
    """A document of 200,000 characters in one cell (Python's csv reader stops at 131,072 by default)."""
    from gpt_ft.data.files import read_table

    document = "the cat sat . " * 15_000
    for name, sep in (("big.csv", ","), ("big.tsv", "\t")):
        (tmp_path / name).write_text(f"sentence{sep}n\n{document}{sep}1\nthe cat .{sep}2\n")
        assert read_table(tmp_path / name)["sentence"] == [document, "the cat ."]


def test_a_csv_header_whose_quoted_name_holds_a_line_break_is_read(tmp_path):
    """A spreadsheet's wrapped header: the names are CSV's, and the rows' lines count from there."""
    from gpt_ft.data.files import read_table

    path = tmp_path / "h.csv"
    path.write_text('sentence,"note\nwrapped",x\nhello,n1,v\nbye,n2\n')
    with pytest.raises(TaskDataError, match=r"h.csv, line 4: 2 fields where there are 3 columns"):
        read_table(path)
    path.write_text('sentence,"note\nwrapped",x\nhello,n1,v\n')
    assert read_table(path).to_list() == [{"sentence": "hello", "note\nwrapped": "n1", "x": "v"}]


def test_a_json_lines_field_of_two_types_is_named_with_its_lines(tmp_path):
    """The loaders' fallback failed on it (with a blank line) naming no line: `Expected object or value`."""
    from gpt_ft.data.files import read_table

    path = tmp_path / "m.jsonl"
    path.write_text('{"sentence": ["a", "b"], "ok": true}\n\n{"sentence": "c", "ok": false}\n')
    two = r"line 3: field 'sentence' holds a string where line 1 holds an array.$"
    with pytest.raises(TaskDataError, match=r"^\S+m.jsonl, " + two):
        read_table(path)


def test_json_lines_whose_records_differ_in_fields_name_the_first_that_does(tmp_path):
    """The reader takes the columns of the records it reads first: a later block with other fields
    fails to cast (PRMBench's files joined: 165 records hold two fields more), which named no line.
    A field a record lacks (line 2) is no such fault: the reader fills it with null."""
    from gpt_ft.data.file_faults import parse_problem

    path = tmp_path / "m.jsonl"
    path.write_text('{"q": "a", "steps": [1]}\n{"q": "b"}\n{"q": "c", "steps": [], "truth": "x"}\n')
    cast = ValueError("Couldn't cast\nq: string\nsteps: list<item: int64>\ntruth: string\nto\n...")
    assert parse_problem(path, "json", None, cast) == (
        ", line 3: it has fields ['truth'] that line 1 has not (the reader takes one set of fields a file: "
        "give each record all, null where none)"
    )
    assert parse_problem(path, "json", None, ValueError("another reason")) == (
        ": cannot be read as json (another reason)"
    )
    # The columns the reader took from its first block, where its error names them: the record with
    # a field outside them (line 3's `truth` was among them; line 4's `other` not).
    path.write_text('{"q": "a"}\n{"q": "b"}\n{"q": "c", "truth": "x"}\n{"q": "d", "other": "y"}\n')
    cast = ValueError("Couldn't cast\nq: string\nother: string\nto\n{'q': Value('string'), 'truth': "
                      "Value('string')}\nbecause column names don't match")  # fmt: skip
    assert parse_problem(path, "json", None, cast).startswith(
        ", line 4: it has fields ['other'] that the lines before have not (the reader takes"
    )


def test_a_hub_configuration_not_in_the_cache_is_not_called_a_missing_split(monkeypatch):
    """Offline, datasets says a configuration is not in its cache with a ValueError of two lines:
    one sentence saying so and what to do, not "has no split"."""
    from gpt_ft.adapters.sources import HubDataset
    from gpt_ft.data.files import located_split

    def offline(path, name, split, data_dir):
        if split == "nowhere":
            raise ValueError(f"Unknown split \"{split}\". Should be one of ['train'].")
        raise ValueError(
            f"Couldn't find cache for {path} for config '{name}'\nAvailable configs in the cache: ['rte']"
        )

    monkeypatch.setattr(datasets, "load_dataset", offline)
    task = SingleText(
        name="t", labels=["a", "b"], hub=HubDataset(path="org/ds", name="mnli", splits={"test": "nowhere"})
    )
    with pytest.raises(TaskDataError) as error:
        located_split(task, "train", None)
    assert str(error.value) == (
        "Hub dataset org/ds (mnli) is not in the datasets cache and cannot be downloaded (Couldn't find "
        "cache for org/ds for config 'mnli' Available configs in the cache: ['rte']); give the task's "
        "files with --data.data_dir DIR."
    )
    with pytest.raises(
        TaskDataError, match=r"^Hub dataset org/ds \(mnli\) has no split 'nowhere': Unknown split"
    ):
        located_split(task, "test", None)


def test_the_wsc_card_reads_the_hubs_flat_copy_as_the_releases_nested_files(monkeypatch, tmp_path):
    """aps/super_glue's wsc.fixed holds the spans as fields of their own; the release files, in a
    record (`target`): the card's renames make both the same texts."""
    from gpt_ft.adapters.cards import load_card

    row = wsc_row(0, True)
    task = load_card(TASKS / "superglue" / "wsc.yaml")
    (tmp_path / "WSC").mkdir()
    (tmp_path / "WSC" / "val.jsonl").write_text(jsonl(row))
    released = load_split(task, "validation", tmp_path)[0]
    flat = {**{k: v for k, v in row.items() if k != "target"}, **row["target"]}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list([flat]))
    hub = load_split(task, "validation", None)[0]
    assert task.texts(released) == task.texts(hub) == [row["text"], "it", " The cat"]  # joined by a space


def test_a_file_read_into_a_log_or_pipe_draws_no_bar(tmp_path, capsys):
    """datasets' "Generating data split" bar redraws with carriage returns: off where stderr is no
    terminal (a log, a pipe), as gpt_ft's own bars are; set back as it was."""
    (tmp_path / "rows.tsv").write_text("sentence\n" + "a cat .\n" * 3)
    capsys.readouterr()
    assert read_table(tmp_path / "rows.tsv").num_rows == 3
    assert "Generating" not in capsys.readouterr().err and not datasets.are_progress_bars_disabled()


def test_the_original_arc_files_are_read_through_their_lists_of_records(tmp_path, tokenizer_dir):
    """ARC's release files keep each choice as a record ({"text", "label"}) in `question.choices`:
    `question.choices.text` reads every choice's; a record without them is named by its line."""
    from gpt_ft.adapters import MultipleChoice

    def record(key, *names):
        choices = [{"text": f"choice {n}", "label": n} for n in names]
        return {"id": "M_1", "question": {"stem": Q, "choices": choices}, "answerKey": key}

    (tmp_path / "ARC-Challenge-Train.jsonl").write_text(jsonl(record("B", *"ABCD"), record("3", *"123")))
    (tmp_path / "bad.jsonl").write_text(jsonl(record("B", *"ABCD"), {"id": "M_2", "question": {"stem": Q}}))
    kw = dict(
        context=["question.stem"], choices="question.choices.text", choice_names="question.choices.label"
    )
    local = LocalFiles(splits={"train": "ARC-Challenge-Train.jsonl", "validation": "bad.jsonl"})
    task = MultipleChoice(name="arc", num_choices=5, label="answerKey", index="id", local=local, **kw)
    ds = load_split(task, "train", tmp_path)
    assert ds["question.choices.label"] == [list("ABCD"), list("123")] and ds["question.stem"] == [Q, Q]
    dm = TaskDataModule(task=task, tokenizer=tokenizer_dir, data_dir=tmp_path, max_length=64)
    assert dm.encoded("train", labelled=True)["label"] == [1, 2]
    assert [len(e["input_ids"]) for e in dm.encoded("train", labelled=True)] == [4, 3]
    assert [dm.explain("train", i)["label"] for i in (0, 1)] == ["B", "3"]  # as the row names it
    with pytest.raises(TaskDataError, match=r"bad.jsonl, line 2: the record has no field 'question.choices."
                       r"text', a text the task reads"):  # fmt: skip
        dm.encoded("validation", labelled=True)
    # The file's columns, as a message names them, are its own: not those made of its nested fields.
    task = MultipleChoice(name="arc", num_choices=5, label="gold", index="id", local=local, **kw)
    dm = TaskDataModule(task=task, tokenizer=tokenizer_dir, data_dir=tmp_path, max_length=64)
    with pytest.raises(TaskDataError, match=r"the file has \['id', 'question', 'answerKey'\]\.$"):
        dm.encoded("train", labelled=True)


def test_a_path_that_names_no_field_is_refused_by_what_it_reaches(tmp_path, tokenizer_dir):
    """A misspelt path (`choices.txt`), or one through a text (`question.text`: ARC's hub question is
    a text; a CSV cell), was read as an empty text in every row."""
    from gpt_ft.adapters import MultipleChoice
    from gpt_ft.eval.classifier import Classifier

    (tmp_path / "arc.parquet").write_bytes(
        parquet({"question": Q, "choices": {"text": ["a"], "label": ["A"]}})
    )
    (tmp_path / "arc.csv").write_text('question,choices\nWhy?,"{""text"": [""a""]}"\n')
    for split, context, choices, message in (
        (
            "p",
            "question",
            "choices.txt",
            "'choices.txt', but 'choices' has no field 'txt' (its fields: text, label).",
        ),
        (
            "p",
            "question.text",
            "choices.text",
            "'question.text', but 'question' holds string values, not records",
        ),
        (
            "c",
            "question",
            "choices.text",
            "'choices.text', but 'choices' holds string values, not records (csv",
        ),
    ):
        local = LocalFiles(splits={"p": "arc.parquet", "c": "arc.csv"})
        task = MultipleChoice(name="arc", context=[context], choices=choices, num_choices=5, local=local)
        with pytest.raises(
            TaskDataError, match=rf"^\S+arc\.(parquet|csv): task 'arc' reads the field {re.escape(message)}"
        ):
            load_split(task, split, tmp_path)
    # A Python record lacking the nested field is named as lacking it, as a top-level one is.
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.model import GPT, GPTConfig

    task = MultipleChoice(name="arc", context=["question"], choices="choices.text", num_choices=5)
    tok = load_tokenizer(tokenizer_dir)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=len(tok))).eval()
    clf = Classifier(
        gpt, task.head(gpt.config.n_embd, dropout=0.0, init_std=0.02), task, tok, max_length=64, device="cpu"
    )
    with pytest.raises(TaskDataError, match=r"^example 0 has no field 'choices.text' \(task 'arc'\)"):
        clf.predict([{"question": "Q", "choices": {"label": ["A"]}}])
    assert clf.predict([{"question": "Q", "choices": {"text": ["a", "b"]}}])[0]["label"] in ("0", "1")


def test_a_file_compressed_otherwise_than_gzip_is_said_so(tmp_path):
    """bz2 and xz are not read (.gz is): the sentence says so, with the format named or not (it said
    "unknown file format", then, given `format: json`, that the file was not UTF-8)."""
    import bz2
    import lzma

    from gpt_ft.data.files import read_table

    text = b'{"sentence": "a b", "label": 1}\n'
    (tmp_path / "t.jsonl.bz2").write_bytes(bz2.compress(text))
    (tmp_path / "t.csv.xz").write_bytes(lzma.compress(b"sentence,label\na b,1\n"))
    (tmp_path / "t.parquet.bz2").write_bytes(bz2.compress(b"PAR1"))
    (tmp_path / "t.bz2").write_bytes(bz2.compress(text))
    cases = (("t.jsonl.bz2", None), ("t.jsonl.bz2", "json"), ("t.csv.xz", None), ("t.parquet.bz2", None),
             ("t.bz2", None))  # fmt: skip
    for name, fmt in cases:
        suffix = name.rsplit(".", 1)[1]
        with pytest.raises(
            TaskDataError, match=rf"^\S+{name}: a \.{suffix} file is not read \(a \.gz one is\): "
        ):
            read_table(tmp_path / name, fmt=fmt)
