"""Check gpt_ft.data.tokenizer against OpenAI's original GPT-1 and GPT-2 BPE files.

Loads both folders with `load_tokenizer`, checks known ids and where the fine-tuning special
tokens land, and compares GPT-1 encodings with a small independent implementation of the
original BPE merges, over words split as transformers' GPT-1 tokenizer splits them (BERT's
pre-tokenizer: lowercase, runs of letters or digits, every other symbol alone). That is not the
original pipeline's split (ftfy, then spaCy's tokenizer: "isn't" -> "is n't"; docs/models.md
says what differs). Prints "OK" and exits 0 when everything matches, exits 1 otherwise.

    python benchmarks/check_tokenizers.py --gpt1 DIR --gpt2 DIR
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Let the script run from a plain checkout, without installing the package.
sys.path.insert(0, str(REPO_ROOT))

from paths import existing  # noqa: E402
from transformers import AutoTokenizer, GPT2TokenizerFast, OpenAIGPTTokenizerFast  # noqa: E402

from gpt_ft.data.tokenizer import SPECIAL_TOKENS, SpecialTokenIds, load_tokenizer, special_token_ids  # noqa: E402

# ASCII on purpose: the reference below splits words the way BERT's pre-tokenizer does for ASCII
# (runs of letters/digits, every other symbol alone), as transformers' GPT-1 tokenizer does; the
# original pipeline's spaCy split ("Isn't" -> "is", "n't"; "e.g." whole) is not what it checks.
PARAGRAPH = (
    "The Transformer uses self-attention; it was introduced in 2017 by Vaswani et al. "
    "Generative pre-training (GPT) then fine-tunes one model on many tasks: entailment, "
    "similarity, question answering and classification. Isn't it remarkable? The 12-layer "
    "decoder has 117M parameters, trained on BooksCorpus (about 7,000 unpublished books) "
    "for 100 epochs! Words like antidisestablishmentarianism, bachelorette and xylophonist "
    'are split into sub-words, e.g. "unbelievably" -> un + believ + ably.'
)
SENTENCES = ["Hello world", " The quick brown fox", "the.", "Fine-tuning GPT-1 in 2018!"]


class Checker:
    """Collects failed checks so that one run reports all of them."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def equal(self, what: str, got: object, expected: object) -> None:
        """Record a failure unless ``got == expected``."""
        if got != expected:
            # Long id lists are cut so that every failure stays readable.
            self.failures.append(f"{what}: got {_short(got)}, expected {_short(expected)}")


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def reference_gpt1_encode(text: str, encoder: dict[str, int], ranks: dict[tuple[str, str], int]) -> list[int]:
    """GPT-1's BPE over BERT-style words: lowercase, split words, BPE each word, unknown -> 0 (OpenAI's
    encoder applied the same merges to spaCy's words)."""
    ids: list[int] = []
    for word in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower()):
        ids.extend(encoder.get(symbol, 0) for symbol in _bpe_word(word, ranks))
    return ids


def _bpe_word(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Merge the adjacent pair with the lowest merge rank until none is left; `</w>` ends the word."""
    symbols = [*word[:-1], word[-1] + "</w>"]
    while len(symbols) > 1:
        ranked = [(ranks[pair], pair) for pair in zip(symbols, symbols[1:]) if pair in ranks]
        if not ranked:
            break
        _, (first, second) = min(ranked)
        merged: list[str] = []
        i = 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
                merged.append(first + second)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def original_gpt1_encode(text: str, encoder, ranks, nlp, fix_text) -> list[int]:
    """OpenAI's GPT-1 encoder as the paper's code ran it: ftfy, its text standardisation (dashes,
    ellipses, runs of punctuation set apart, newlines kept), spaCy's words lowercased, BPE each."""
    text = fix_text(text)
    for old, new in (("—", "-"), ("–", "-"), ("―", "-"), ("…", "..."), ("´", "'")):
        text = text.replace(old, new)
    text = re.sub(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""", r" \1 ", text)
    text = re.sub(r"[^\S\n]+", " ", re.sub(r"\s*\n\s*", " \n ", text)).strip()
    ids: list[int] = []
    for word in nlp(text):
        symbols = _bpe_word(word.text.lower(), ranks)
        ids.extend(encoder.get("\n</w>" if s == "\n  </w>" else s, 0) for s in symbols)
    return ids


def compare_with_the_original(tokenizer, directory: Path, files: list[Path]) -> None:
    """How many texts (the columns named sentence*, of GLUE TSVs) transformers' GPT-1 tokenizer
    splits otherwise than OpenAI's encoder; needs ftfy and spaCy."""
    import csv

    from ftfy import fix_text
    from spacy.lang.en import English

    encoder, ranks = _read_gpt1_files(directory)
    nlp = English().tokenizer
    for path in files:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        texts = [row[c] for row in rows for c in row if c and c.startswith("sentence")]
        ours = tokenizer(texts, add_special_tokens=False)["input_ids"]
        theirs = [original_gpt1_encode(t, encoder, ranks, nlp, fix_text) for t in texts]
        differ = sum(a != b for a, b in zip(ours, theirs))
        print(f"{path}: {differ} of {len(texts)} texts tokenized otherwise than OpenAI's encoder "
              f"({sum(map(len, ours)):,} tokens against {sum(map(len, theirs)):,})")  # fmt: skip


def _read_gpt1_files(directory: str) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    directory = Path(directory)
    encoder = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
    # Line 0 is the "#version" header and the file ends with a newline, as in the original encoder.
    merges = [tuple(line.split(" ")) for line in lines[1:] if line]
    return encoder, {pair: rank for rank, pair in enumerate(merges)}


def _check_round_trip(check: Checker, label: str, tokenizer, text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        reloaded = AutoTokenizer.from_pretrained(tmp)
    check.equal(
        f"{label} specials after save/reload", special_token_ids(reloaded), special_token_ids(tokenizer)
    )
    check.equal(f"{label} ids after save/reload", reloaded(text)["input_ids"], tokenizer(text)["input_ids"])


def main(argv: list[str] | None = None) -> int:
    """Run all checks; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt1", type=existing, required=True, help="GPT-1 vocab/merges dir")
    parser.add_argument("--gpt2", type=existing, required=True, help="GPT-2 vocab/merges dir")
    parser.add_argument("--against-original", type=existing, nargs="*", default=[], metavar="TSV",
                        help="also count the texts of these GLUE TSVs that OpenAI's encoder (ftfy, spaCy) "
                        "splits otherwise")  # fmt: skip
    args = parser.parse_args(argv)
    check = Checker()
    framed = f"{SPECIAL_TOKENS['start']}Is it true?{SPECIAL_TOKENS['delim']}Yes.{SPECIAL_TOKENS['extract']}"

    gpt2 = load_tokenizer(args.gpt2)
    print(f"gpt2: {type(gpt2).__name__}, len {len(gpt2)}, {special_token_ids(gpt2)}")
    check.equal("gpt2 class", isinstance(gpt2, GPT2TokenizerFast), True)
    for text in [*SENTENCES, framed]:
        print(f"  gpt2 {text!r} -> {gpt2(text)['input_ids']}")
    check.equal("gpt2 'Hello world'", gpt2("Hello world")["input_ids"], [15496, 995])
    check.equal(
        "gpt2 ' The quick brown fox'", gpt2(" The quick brown fox")["input_ids"], [383, 2068, 7586, 21831]
    )
    check.equal("gpt2 base vocab", len(load_tokenizer(args.gpt2, add_specials=False)), 50257)
    check.equal(
        "gpt2 specials", special_token_ids(gpt2), SpecialTokenIds(50257, 50258, 50259, 50260, eos=50256)
    )
    check.equal("gpt2 len", len(gpt2), 50261)
    check.equal("gpt2 framed decode", gpt2.decode(gpt2(framed)["input_ids"]), framed)
    _check_round_trip(check, "gpt2", gpt2, framed)

    gpt1 = load_tokenizer(args.gpt1)
    print(f"gpt1: {type(gpt1).__name__}, len {len(gpt1)}, {special_token_ids(gpt1)}")
    check.equal("gpt1 class", isinstance(gpt1, OpenAIGPTTokenizerFast), True)
    for text in [*SENTENCES, framed]:
        print(f"  gpt1 {text!r} -> {gpt1(text)['input_ids']}")
    check.equal("gpt1 base vocab", len(load_tokenizer(args.gpt1, add_specials=False)), 40478)
    check.equal(
        "gpt1 specials", special_token_ids(gpt1), SpecialTokenIds(40478, 40479, 40480, 40481, eos=None)
    )
    check.equal("gpt1 len", len(gpt1), 40482)
    check.equal("gpt1 'the.'", gpt1("the.")["input_ids"], [481, 239])
    framed_ids = gpt1(framed)["input_ids"]
    check.equal("gpt1 framed first/last id", (framed_ids[0], framed_ids[-1]), (40478, 40480))
    _check_round_trip(check, "gpt1", gpt1, framed)

    encoder, ranks = _read_gpt1_files(args.gpt1)
    texts = [*SENTENCES, PARAGRAPH, *PARAGRAPH.split(". ")]
    for text in texts:
        check.equal(
            f"gpt1 vs reference on {text[:40]!r}",
            gpt1(text)["input_ids"],
            reference_gpt1_encode(text, encoder, ranks),
        )
    n_ids = len(reference_gpt1_encode(PARAGRAPH, encoder, ranks))
    print(f"gpt1 matches the reference BPE on {len(texts)} texts (paragraph: {n_ids} tokens)")
    if args.against_original:
        compare_with_the_original(
            load_tokenizer(args.gpt1, add_specials=False), args.gpt1, args.against_original
        )

    if check.failures:
        print(f"FAILED ({len(check.failures)} mismatches):", *check.failures, sep="\n  ")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
