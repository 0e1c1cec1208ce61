"""TF-IDF baselines for the ablation's tasks: what a bag of words gets without any pretraining.

Word 1-2-gram TF-IDF fitted on each task's training split, then:
  SST-2        logistic regression on the sentence's features
  RTE          logistic regression on [premise, hypothesis, premise * hypothesis]
  STS-B        ridge regression on [a * b, |a - b|] (Pearson x 100 on dev)
  Story Cloze  logistic regression scoring (context * ending, ending); the higher-scored ending wins
               (trained on 1497 stories of the 2016 validation file, scored on the other 374, as
               GPT-1's code and tasks/storycloze.yaml split it)
Scores are on the dev / held-out split, in the same units as the fine-tuning tables. Needs
scikit-learn (`pip install -e ".[bench]"`).

    python benchmarks/tfidf_baseline.py --glue GLUE_DIR --storycloze STORYCLOZE_DIR
    python benchmarks/tfidf_baseline.py --glue GLUE_DIR --storycloze DIR --train-sizes 100 300 1000 3000

With --train-sizes each model trains on the class-stratified subsets `gpt-ft suite --train_sizes`
draws at each seed (the same rows); --json then writes the curves `gpt-ft suite --baselines FILE`
draws beside the fine-tuned rows (by task card: sst2, rte, stsb).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from paths import existing


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def vectorizer(texts: list[str]):
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2).fit(texts)


def logistic():
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=4.0, max_iter=2000)


def subset(rows: list[dict[str, str]], label: str, size: int | None, seed: int) -> list[dict[str, str]]:
    """The class-stratified subset `gpt-ft suite --train_sizes` fine-tunes on at this size and seed
    (the same rows: the same labels in the same order); all rows for None."""
    if size is None:
        return rows
    from gpt_ft.data.subsets import stratified_subset

    return [rows[i] for i in stratified_subset([r[label] for r in rows], size, seed)]


def sst2(glue: Path, size: int | None = None, seed: int = 0) -> float:
    train, dev = read_tsv(glue / "SST-2" / "train.tsv"), read_tsv(glue / "SST-2" / "dev.tsv")
    train = subset(train, "label", size, seed)
    vec = vectorizer([r["sentence"] for r in train])
    model = logistic().fit(vec.transform([r["sentence"] for r in train]), [int(r["label"]) for r in train])
    predicted = model.predict(vec.transform([r["sentence"] for r in dev]))
    return 100 * float(np.mean(predicted == np.array([int(r["label"]) for r in dev])))


def pair_features(vec, a: list[str], b: list[str], *, product_and_distance: bool = False):
    from scipy.sparse import hstack

    x, y = vec.transform(a), vec.transform(b)
    if product_and_distance:
        return hstack([x.multiply(y), abs(x - y)]).tocsr()
    return hstack([x, y, x.multiply(y)]).tocsr()


def rte(glue: Path, size: int | None = None, seed: int = 0) -> float:
    train, dev = read_tsv(glue / "RTE" / "train.tsv"), read_tsv(glue / "RTE" / "dev.tsv")
    train = subset(train, "label", size, seed)
    vec = vectorizer([r["sentence1"] for r in train] + [r["sentence2"] for r in train])

    def xy(rows):
        x = pair_features(vec, [r["sentence1"] for r in rows], [r["sentence2"] for r in rows])
        return x, np.array([r["label"] == "entailment" for r in rows])

    model = logistic().fit(*xy(train))
    x, y = xy(dev)
    return 100 * float(np.mean(model.predict(x) == y))


def stsb(glue: Path, size: int | None = None, seed: int = 0) -> float:
    from sklearn.linear_model import Ridge

    train, dev = read_tsv(glue / "STS-B" / "train.tsv"), read_tsv(glue / "STS-B" / "dev.tsv")
    train = subset(train, "score", size, seed)
    vec = vectorizer([r["sentence1"] for r in train] + [r["sentence2"] for r in train])

    def xy(rows):
        x = pair_features(vec, [r["sentence1"] for r in rows], [r["sentence2"] for r in rows],
                          product_and_distance=True)  # fmt: skip
        return x, np.array([float(r["score"]) for r in rows])

    model = Ridge(alpha=1.0).fit(*xy(train))
    x, y = xy(dev)
    return 100 * float(np.corrcoef(model.predict(x), y)[0, 1])


def story_cloze(folder: Path) -> float:
    from scipy.sparse import hstack

    (path,) = folder.glob("*val*.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    from sklearn.model_selection import train_test_split

    train, held_out = train_test_split(rows, test_size=374, random_state=3535999445)  # GPT-1's split
    context = lambda r: " ".join(r[f"InputSentence{i}"] for i in range(1, 5))  # noqa: E731
    endings = lambda r: [r["RandomFifthSentenceQuiz1"], r["RandomFifthSentenceQuiz2"]]  # noqa: E731
    vec = vectorizer([context(r) for r in train] + [e for r in train for e in endings(r)])

    def features(rows):  # one row per (story, ending)
        c = vec.transform([context(r) for r in rows for _ in range(2)])
        e = vec.transform([e for r in rows for e in endings(r)])
        return hstack([c.multiply(e), e]).tocsr()

    right = lambda rows: np.array([int(r["AnswerRightEnding"]) - 1 for r in rows])  # noqa: E731
    labels = np.zeros(2 * len(train), dtype=bool)
    labels[2 * np.arange(len(train)) + right(train)] = True
    model = logistic().fit(features(train), labels)
    scores = model.decision_function(features(held_out)).reshape(-1, 2)
    return 100 * float(np.mean(scores.argmax(axis=1) == right(held_out)))


def size(text: str) -> int | str:
    """A training-set size: a positive whole number, or all."""
    if text != "all" and not (text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number or 'all'")
    return text if text == "all" else int(text)


def mean_std(values: list[float]) -> str:
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", type=existing, required=True)
    parser.add_argument("--storycloze", type=existing, required=True)
    parser.add_argument("--json", default=None, help="also write the scores to this file")
    parser.add_argument("--train-sizes", type=size, nargs="*", default=[],
                        help="learning curves: SST-2, RTE, STS-B on the suite's subsets")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the subsets' seeds")
    args = parser.parse_args()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        sys.exit('tfidf_baseline.py needs scikit-learn: pip install -e ".[bench]"')
    glue = Path(args.glue)
    if args.train_sizes:
        curves = {}
        print("TF-IDF by labelled training examples (dev; mean ± std over seeds " + f"{args.seeds}):")
        for name, card, score in (("SST-2", "sst2", sst2), ("RTE", "rte", rte), ("STS-B", "stsb", stsb)):
            curves[card] = {n: {seed: score(glue, None if n == "all" else n, seed) for seed in args.seeds}
                            for n in args.train_sizes}  # fmt: skip
            cells = [f"{n}: {mean_std(list(v.values()))}" for n, v in curves[card].items()]
            print(f"  {name:<6} " + ", ".join(cells))
        if args.json:  # the file `gpt-ft suite --baselines` draws beside the fine-tuned rows
            text = json.dumps({"name": "TF-IDF + linear", "tasks": curves}, indent=2)
            Path(args.json).write_text(text + "\n")
        return
    scores = {
        "SST-2": sst2(glue),
        "RTE": rte(glue),
        "STS-B": stsb(glue),
        "StoryCloze": story_cloze(Path(args.storycloze)),
    }
    print("TF-IDF baseline (dev / held-out):")
    for task, score in scores.items():
        print(f"  {task:<11} {score:5.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(scores, indent=2) + "\n")


if __name__ == "__main__":
    main()
