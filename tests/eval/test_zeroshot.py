"""Zero-shot scoring by hand-built models: choices' likelihoods, verbalizers, the threshold heuristic."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from gpt_ft.adapters import TaskDataError
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval.zeroshot import (
    ZeroShot,
    ZeroShotScorer,
    best_threshold,
    check_method,
    continuation_logprobs,
    evaluate,
)
from gpt_ft.model import GPT, GPTConfig


def unigram_gpt(vocab_size: int, logits: torch.Tensor) -> GPT:
    """A GPT-1 whose next-token distribution is softmax(logits) at every position: the last block's
    LayerNorm outputs a constant unit vector e_0, and the tied head reads column 0 of the embedding."""
    config = GPTConfig.from_name("gpt-micro", vocab_size=vocab_size, n_embd=16, n_layer=1, n_head=2)
    gpt = GPT(config).eval()
    with torch.no_grad():
        gpt.h[-1].ln_2.weight.zero_()
        gpt.h[-1].ln_2.bias.zero_()
        gpt.h[-1].ln_2.bias[0] = 1.0
        gpt.wte.weight[: len(logits), 0] = logits
    return gpt


def test_multiple_choice_zero_shot_matches_hand_computed_likelihoods(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    short, long = "happy", "the cat sat on the mat"
    assert not set(ids(" " + short)) & set(ids(" " + long))
    logits = torch.zeros(len(tok))
    logits[ids(" " + long)] = 8.0
    logits[ids(" " + short)] = 7.0
    gpt = unigram_gpt(len(tok), logits)
    logp = torch.log_softmax(logits, dim=0)
    expected = {c: float(logp[ids(" " + c)].sum()) for c in (short, long)}
    # The context does not matter to a unigram model; the sums are the choices' token log-probs.
    got = continuation_logprobs(
        gpt, [(ids("a story ."), ids(" " + short)), (ids("a story ."), ids(" " + long))]
    )
    assert got == pytest.approx([expected[short], expected[long]], abs=1e-4)
    # Summed, the one-token answer wins; per character, the long one does.
    assert expected[short] > expected[long]
    assert expected[short] / len(short) < expected[long] / len(long)

    from gpt_ft.adapters import MultipleChoice

    task = MultipleChoice(name="mc", context=["story"], choices=["a", "b"], labels=["1", "2"])
    rows = [{"story": "a story .", "a": short, "b": long, "label": "1"}]
    scorer = ZeroShotScorer(gpt, tok)
    # Per token (GPT-1's rule for RACE), the long answer's tokens are each likelier: it wins too.
    assert expected[short] / len(ids(" " + short)) < expected[long] / len(ids(" " + long))
    assert evaluate(task, scorer, lambda split: rows) == {
        "validation/accuracy": 1.0,
        "validation/accuracy_norm": 0.0,
        "validation/accuracy_token": 0.0,
    }


def test_a_choice_is_scored_as_the_file_holds_it_unless_the_card_strips_texts(tokenizer_dir):
    """After one space, the choice as written (lm-evaluation-harness's `" " + choice`), its length in
    characters with its own spaces; they were stripped, which changed OpenBookQA's acc_norm (50 for
    25 on four rows whose choices end in a space). `strip_texts` strips them, as training reads them."""
    from gpt_ft.adapters import MultipleChoice

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    rows = [{"q": "a story .", "a": "the cat ", "b": " sat", "label": "1"}]
    # per character, -8 over "the cat " (8) beats -4.5 over " sat" (4); -8 over "the cat" (7) loses
    # to -3.3 over "sat" (3)
    for strip, choices, scores, norm in ((False, ["the cat ", " sat"], [-8.0, -4.5], 1.0),
                                         (True, ["the cat", "sat"], [-8.0, -3.3], 0.0)):  # fmt: skip
        task = MultipleChoice(
            name="mc", context=["q"], choices=["a", "b"], labels=["1", "2"], strip_texts=strip
        )
        scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
        asked = []
        scorer.logprobs = lambda requests, scores=scores: asked.extend(requests) or scores
        got = scorer.multiple_choice(task, rows)
        assert [tok.decode(continuation) for _, continuation in asked] == [" " + c for c in choices]
        assert (got["accuracy"], got["accuracy_norm"]) == (0.0, norm), (strip, got)


def test_verbalizers_and_threshold_heuristics(tokenizer_dir):
    from gpt_ft.adapters import SingleText

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    logits = torch.zeros(len(tok))
    logits[ids(" dogs")] = 3.0  # the model likes " dogs" more than " cat"
    gpt = unigram_gpt(len(tok), logits)
    task = SingleText(name="s", labels=["neg", "pos"], metrics=["accuracy"])
    rows = [{"sentence": "the mat", "label": "pos"}, {"sentence": "a man", "label": "neg"}]
    spec = ZeroShot(suffix=" very", verbalizers=[" cat", " dogs"])
    scorer = ZeroShotScorer(gpt, tok)
    assert scorer.verbalizers(task, spec, rows).tolist() == [1, 1]
    assert evaluate(task, scorer, lambda split: rows, spec) == {"validation/accuracy": 0.5}
    with pytest.raises(TaskDataError, match=r"^task 's': split 'validation' has no labelled examples"):
        evaluate(task, scorer, lambda split: [], spec)  # every label ignored (`ignore_labels`)
    # The card's `strip_texts` holds here as in training (a pair's inner spaces were kept).
    from gpt_ft.adapters import TextPair

    pair, seen = TextPair(name="p", labels=["neg", "pos"], strip_texts=True), []
    scorer.logprobs = lambda requests: seen.extend(requests) or [0.0] * len(requests)
    scorer.verbalizers(pair, spec, [{"premise": " the mat ", "hypothesis": " a man ", "label": "pos"}])
    assert scorer.prefix and seen[0] == (
        ids("the mat a man very"),
        ids(" cat"),
    )  # read as it is, as the harness
    del scorer.logprobs

    # Threshold: the cut that maximises the metric on calibration scores, above it is label 1.
    scores = torch.tensor([-3.0, -1.0, -2.0, -0.5])
    labels = torch.tensor([0, 1, 0, 1])
    accuracy = lambda p, y: float((p == y).float().mean())  # noqa: E731
    assert best_threshold(scores, labels, accuracy) == pytest.approx(-1.5)
    # Average log-probability of " dogs dogs" beats " cat cat" under this model: with the
    # threshold learnt on these two, each is classified right.
    calibration = [{"sentence": "dogs dogs", "label": "pos"}, {"sentence": "cat cat", "label": "neg"}]
    average = scorer.average_logprobs(task, calibration)
    assert average[0] > average[1]
    result = evaluate(task, scorer, lambda split: calibration, ZeroShot(threshold=True))
    assert result == {"validation/accuracy": 1.0}
    with pytest.raises(ValueError, match="`verbalizers` or `threshold: true`"):
        ZeroShot()
    assert ZeroShot(threshold=True, calibration_examples=None).calibration_examples is None  # every row
    for none in (0, -5):  # no threshold to choose (an IndexError), or all but the last five
        with pytest.raises(
            ValueError, match=rf"^zero_shot: calibration_examples must be at least 1, got {none}\.$"
        ):
            ZeroShot(threshold=True, calibration_examples=none)


def test_average_logprob_of_a_text_longer_than_the_context(tokenizer_dir):
    from gpt_ft.adapters import SingleText

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    logits = torch.zeros(len(tok))
    gpt = unigram_gpt(len(tok), logits)  # uniform: every token's log-probability is -log(V)
    text = " ".join(["dogs"] * 300)
    assert len(tok(text, add_special_tokens=False)["input_ids"]) > gpt.config.n_positions
    task = SingleText(name="s", labels=["neg", "pos"], metrics=["accuracy"])
    averages = ZeroShotScorer(gpt, tok).average_logprobs(task, [{"sentence": text, "label": "neg"}])
    # The earliest tokens fall out of the context unscored; the average is over the scored ones.
    assert averages.tolist() == pytest.approx([-math.log(len(tok))], abs=1e-4)


def test_scored_tokens_are_all_the_continuations_unless_it_outgrows_the_context():
    from gpt_ft.eval.zeroshot import scored_tokens

    assert scored_tokens(5, 3, 64) == 3
    assert scored_tokens(100, 10, 64) == 10  # the context loses its earliest tokens
    assert scored_tokens(0, 100, 64) == 64 and scored_tokens(1, 70, 64) == 64


def test_texts_start_as_the_tokenizer_starts_them(tokenizer_dir):
    """After the beginning-of-text token where the tokenizer starts texts with one (Llama, Gemma:
    lm-evaluation-harness's prefix), else after its end-of-text token; scored as transformers
    scores the text the tokenizer makes."""
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    tok.eos_token = "<|endoftext|>"
    gpt2_way = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    assert gpt2_way.prefix == [eos]  # a text scored whole begins after it: its first token predicted
    # A choice's context is read as it is, after end-of-text only when empty (lm-evaluation-harness's
    # `loglikelihood`: its prefix token for an empty context alone).
    from gpt_ft.adapters import MultipleChoice, SingleText

    seen, task = [], MultipleChoice(name="mc", context=["story"], choices=["a", "b"], labels=["1", "2"])
    gpt2_way.logprobs = lambda requests: seen.extend(requests) or [0.0] * len(requests)
    rows = [
        {"story": "a story .", "a": "x", "b": "y", "label": "1"},
        {"story": "", "a": "x", "b": "y", "label": "2"},
    ]
    gpt2_way.multiple_choice(task, rows)
    assert [context for context, _ in seen] == [gpt2_way.ids("a story .")] * 2 + [[eos]] * 2
    # A beginning-of-text token the tokenizer does not add itself (SmolLM2's) starts an empty context
    # and a text scored whole (the harness's `prefix_token_id`: bos, else eos; its rolling
    # log-likelihood starts there too).
    tok.bos_token = tok.convert_ids_to_tokens(eos + 1)
    smollm_way, seen[:] = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok), []
    smollm_way.logprobs = lambda requests: seen.extend(requests) or [0.0] * len(requests)
    smollm_way.multiple_choice(task, rows)
    assert [context for context, _ in seen][2:] == [[eos + 1]] * 2 and smollm_way.prefix == [eos + 1]
    seen[:] = []
    smollm_way.average_logprobs(SingleText(name="s", labels=["no", "yes"]), [{"sentence": "a story ."}])
    assert seen == [([eos + 1], smollm_way.ids("a story ."))]
    bos = eos + 1  # a token of its own, as Llama's <s>
    tok.bos_token = tok.convert_ids_to_tokens(bos)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, bos)]
    )
    torch.manual_seed(0)
    shape = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), num_key_value_heads=2, **shape)).eval()
    from gpt_ft import GPT as Weights

    scorer = ZeroShotScorer(Weights.from_hf(hf), tok)
    assert scorer.prefix == [bos]
    context, ending = "the cat sat on the mat .", " he is happy now ."
    text = tok(context)["input_ids"] + scorer.ids(ending)  # what the tokenizer makes of it: <s> first
    assert text[0] == bos and scorer.prefix + scorer.ids(context) == text[: -len(scorer.ids(ending))]
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([text])).logits[0, :-1], -1)
    first = len(text) - len(scorer.ids(ending))
    expected = float(sum(logp[i - 1, t] for i, t in enumerate(text) if i >= first))
    (got,) = scorer.logprobs([(scorer.prefix + scorer.ids(context), scorer.ids(ending))])
    assert got == pytest.approx(expected, abs=1e-4)


def test_an_empty_context_with_nothing_to_start_the_text_is_refused(tokenizer_dir):
    # Without a beginning- or end-of-text token, a choice after an empty context loses its first token
    # to the context: a one-token choice would score nothing (a division by zero per token) and always win.
    from gpt_ft.adapters import MultipleChoice, SingleText

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    tok.eos_token = tok.bos_token = None
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    assert scorer.prefix == []
    task = MultipleChoice(name="mc", context=["story"], choices=["a", "b"], labels=["1", "2"])
    rows = [{"story": "a story .", "a": "a", "b": "the cat", "label": "1"}, {"story": "", "a": "a", "b": "b"}]
    with pytest.raises(
        TaskDataError, match="task 'mc': split 'validation', labelled example 2 has an empty context"
    ):
        evaluate(task, scorer, lambda split: rows)
    assert set(evaluate(task, scorer, lambda split: rows[:1])) == {
        "validation/accuracy",
        "validation/accuracy_norm",
        "validation/accuracy_token",
    }
    # An empty choice is refused (a byte-level BPE scored its space, GPT-1's none); one the tokenizer
    # gives no token is named, not "A continuation to score has no tokens".
    empty = [rows[0], {"story": "a story .", "a": "a", "b": " ", "label": "1"}]
    with pytest.raises(
        TaskDataError,
        match=r"^task 'mc': split 'validation', labelled example 2: choice 2 \(field 'b'\) is empty: a",
    ):
        evaluate(task, scorer, lambda split: empty)
    ids = scorer.ids
    scorer.ids = lambda text: ids(text) if "dropped" not in text else []
    dropped = [rows[0], {"story": "a story .", "a": "a", "b": "dropped", "label": "1"}]
    with pytest.raises(
        TaskDataError,
        match=r"^task 'mc': split 'validation', labelled example 2's choice 2 has no tokens of its own",
    ):
        evaluate(task, scorer, lambda split: dropped)
    scorer.ids = ids
    # A label past the row's choices is refused, as fine-tuning refuses it (it scored as a miss):
    # rows of up to 3 choices, this one of 2 (a card naming more choices than its fields is refused)
    past = [
        {"story": "a story .", "c": ["a", "the cat"], "label": "1"},
        {"story": "a story .", "c": ["a", "b"], "label": "3"},
    ]
    task3 = MultipleChoice(name="mc", context=["story"], choices="c", num_choices=3, labels=["1", "2", "3"])
    with pytest.raises(
        TaskDataError, match=r"^task 'mc': split 'validation', labelled example 2's label '3' points"
    ):
        evaluate(task3, scorer, lambda split: past)
    # A verbalizer of one token after an empty text has nothing before it to be scored after.
    from gpt_ft.eval.zeroshot import ZeroShot

    single = SingleText(name="s", labels=["neg", "pos"], metrics=["accuracy"])
    spec = ZeroShot(verbalizers=[" a", " the cat"])
    with pytest.raises(TaskDataError, match=r"^task 's': example 1's text is empty, which a tokenizer with"):
        scorer.verbalizers(single, spec, [{"sentence": "", "label": "pos"}])
    # The threshold rule's average log-probability: a one-token text has nothing scored.
    single = SingleText(name="s", labels=["neg", "pos"], metrics=["accuracy"])
    texts = [{"sentence": "the cat sat", "label": "pos"}, {"sentence": "", "label": "neg"}]
    with pytest.raises(TaskDataError, match=r"^task 's': example 2's text of 0 token\(s\) cannot be scored"):
        scorer.average_logprobs(single, texts)
    assert scorer.average_logprobs(single, texts[:1]).isfinite().all()


def test_a_base_model_without_its_lm_head_is_refused_where_the_head_is_read(tmp_path, capsys):
    """A LlamaModel folder (no LM head, untied) loads with a head made afresh, for fine-tuning; zero-shot
    scoring and generation, which read its probabilities, refuse it (they scored noise)."""
    from transformers import LlamaConfig, LlamaModel

    from gpt_ft import GPT as Weights
    from gpt_ft.cli import main
    from gpt_ft.eval.zeroshot import score

    shape = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    config = LlamaConfig(vocab_size=64, num_key_value_heads=2, tie_word_embeddings=False, **shape)
    LlamaModel(config).save_pretrained(tmp_path / "base")
    gpt = Weights.from_pretrained(tmp_path / "base")
    assert gpt.fresh_lm_head and gpt.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)
    said = "holds a base model without an LM head (a head made afresh is noise): zero-shot scoring reads"
    with pytest.raises(ValueError, match=re.escape(said)):
        score(None, str(tmp_path / "base"), None, lambda split: [], None, "x")
    with pytest.raises(SystemExit):
        main(["generate", f"--ckpt_path={tmp_path / 'base'}", "--prompt=hi"])
    assert (
        "base model without an LM head (a head made afresh is noise): generate reads"
        in capsys.readouterr().err
    )


def test_the_suites_rows_name_a_bad_ones_file_and_line(tmp_path):
    """Zero-shot scoring reads a split's rows as training reads them: a missing label column, a row
    without a label, a label that is no class and an empty ending are named by file and line
    (zero-shot said "needs labelled examples", or named no file, and scored an empty ending)."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.files import labelled_rows
    from tests.helpers import make_task, write_rows

    task = load_card(make_task("choice", tmp_path))
    assert [row["id"] for row in labelled_rows(task, "validation", tmp_path)] == [f"s-{i}" for i in range(5)]
    dev = tmp_path / "d" / "dev.csv"
    header = ["id", "story", "end1", "end2", "label"]
    good = ["s-0", "A story.", "He is happy now.", "He joined a gang.", 1]
    for row, said in [
        (
            ["s-1", "A story.", "Ends.", " ", 2],
            "line 3: choice 2 (field 'end2') is empty: a choice needs a text",
        ),
        (["s-1", "A story.", "Ends.", "Ends too.", 3], "line 3: label '3' in field 'label' is not among"),
        (
            ["s-1", "A story.", "Ends.", "Ends too.", ""],
            "line 3: no label (field 'label'): zero-shot scoring",
        ),
    ]:
        write_rows(dev, header, [good, row])
        with pytest.raises(TaskDataError, match=f"^{dev}, {re.escape(said)}"):
            labelled_rows(task, "validation", tmp_path)
    write_rows(dev, header[:-1], [good[:-1]])
    with pytest.raises(TaskDataError, match=rf"^{dev}: missing column\(s\) \['label'\] needed by task 'mc'"):
        labelled_rows(task, "validation", tmp_path)
    # Rows of 2 to 4 choices: a label past its own row's choices (it named an example number).
    card = tmp_path / "list.yaml"
    card.write_text(
        "class_path: gpt_ft.adapters.MultipleChoice\ninit_args:\n  name: lists\n  context: [question]\n"
        "  choices: options\n  num_choices: 4\n  local: {splits: {validation: dev.jsonl}}\n"
    )
    rows = [
        {"question": "Q?", "options": ["a", "b", "c", "d"], "label": 3},
        {"question": "Q?", "options": ["a", "b"]},
    ]
    for label, said in ((1, None), (2, "line 2: label 2 points past the row's 2 choices.")):
        (tmp_path / "dev.jsonl").write_text(
            "".join(json.dumps({**r, "label": r.get("label", label)}) + "\n" for r in rows)
        )
        if said is None:
            assert len(labelled_rows(load_card(card), "validation", tmp_path)) == 2
            continue
        with pytest.raises(TaskDataError, match=f"^{tmp_path / 'dev.jsonl'}, {re.escape(said)}$"):
            labelled_rows(load_card(card), "validation", tmp_path)


def test_summed_log_likelihoods_hold_to_float32s_precision():
    """Over a (B, V, T) layout the CPU's cross-entropy summed 40 tokens of a 49,152-token
    vocabulary 2.3e-3 nats away from float64's; per row (B·T, V), as float32 logits allow."""
    torch.manual_seed(0)
    vocab = 49152
    gpt = unigram_gpt(vocab, torch.randn(vocab) * 4)
    context, continuation = torch.randint(0, vocab, (20,)).tolist(), torch.randint(0, vocab, (40,)).tolist()
    (got,) = continuation_logprobs(gpt, [(context, continuation)], batch_size=1)
    with torch.no_grad():
        logits = gpt.lm_logits(gpt(torch.tensor([context + continuation])[:, :-1]))[0].double()
    at = torch.arange(len(context) - 1, len(context) + len(continuation) - 1)
    expected = torch.log_softmax(logits, -1)[at, torch.tensor(continuation)].sum().item()
    assert got == pytest.approx(expected, abs=5e-4)


def test_a_fill_in_task_scores_the_rest_of_the_sentence_after_each_option(tokenizer_dir):
    """WinoGrande's partial scoring (lm-evaluation-harness): the context is the sentence up to the
    blank with the option in it, the text scored the rest of the sentence, the same for both."""
    from gpt_ft.adapters import FillIn

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    task = FillIn(
        name="wg", sentence="sentence", options=["option1", "option2"], labels=["1", "2"], label="answer"
    )
    rows = [{"sentence": "The cat sat on the _ .", "option1": "mat", "option2": "dog", "answer": "2"}]
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    asked = []
    scorer.logprobs = lambda requests: asked.extend(requests) or [-2.0, -1.0]
    assert scorer.multiple_choice(task, rows)["accuracy"] == 1.0
    lead = scorer.start or []
    assert asked == [
        (lead + ids("The cat sat on the mat"), ids(" .")),
        (lead + ids("The cat sat on the dog"), ids(" .")),
    ]


def sentencepiece_style_tokenizer():
    """A tokenizer that marks each word's start with `▁` by a normalizer (Llama 2's, Mistral's): its
    " was" alone is `▁▁was`, a token the text never had."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    words = ["the cat was too close to the edge", "the cup fell off the table", "answer no yes question"]
    tok.train_from_iterator(words * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def test_a_continuation_is_encoded_as_it_reads_after_its_context():
    """As lm-evaluation-harness encodes a pair: the whole text, split after the context's tokens,
    the context's trailing spaces moved to the continuation. Encoded alone, " was" began with a
    lone `▁` the text never has, which was scored."""
    from gpt_ft.adapters import FillIn

    tok = sentencepiece_style_tokenizer()
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert tok.convert_ids_to_tokens(ids(" was"))[0] == "▁"  # the token it must not score
    task = FillIn(name="wg", sentence="s", options=["a", "b"], labels=["1", "2"], label="y")
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    asked = []
    scorer.logprobs = lambda requests: asked.extend(requests) or [0.0] * len(requests)
    scorer.multiple_choice(task, [{"s": "the _ was too close", "a": "cup", "b": "cat", "y": "1"}])
    whole = ids("the cup was too close")
    assert asked[0] == (ids("the cup"), whole[len(ids("the cup")) :])
    assert tok.convert_ids_to_tokens(asked[0][1])[0] == "▁was"
    assert scorer.pair("the cup ", "was") == scorer.pair("the cup", " was")  # spaces go with the continuation


def test_a_verbalizers_template_writes_the_examples_fields_into_its_text(tokenizer_dir):
    """BoolQ as lm-evaluation-harness asks it: "{passage}\\nQuestion: {question}?\\nAnswer:"."""
    from gpt_ft.adapters import TextPair

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    task = TextPair(
        name="boolq", premise="passage", hypothesis="question", labels=["False", "True"], label="answer"
    )
    spec = ZeroShot(template="{passage}\nQuestion: {question}?\nAnswer:", verbalizers=[" no", " yes"])
    row = {"passage": "The cat sat.", "question": "did the cat sit", "answer": True}
    assert spec.text(task, row) == "The cat sat.\nQuestion: did the cat sit?\nAnswer:"
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    asked = []
    scorer.logprobs = lambda requests: asked.extend(requests) or [-1.0, -2.0]
    assert scorer.verbalizers(task, spec, [row]).tolist() == [0]
    context = scorer.ids(spec.text(task, row))  # as lm-evaluation-harness reads it: no token before it
    assert asked == [(context, scorer.ids(" no")), (context, scorer.ids(" yes"))] and scorer.prefix
    check_method(task, spec)
    with pytest.raises(
        ValueError, match=r"the template names 'passsage', not a text field of the card: 'passage', "
    ):
        check_method(task, ZeroShot(template="{passsage}", verbalizers=[" no", " yes"]))
    with pytest.raises(ValueError, match="a template goes with verbalizers"):
        ZeroShot(template="{passage}", threshold=True)


def test_a_jinja_template_asks_as_the_harness_prompt_it_copies(tokenizer_dir):
    """SuperGLUE's WiC as lm-evaluation-harness asks it: its `doc_to_text` copied as it is, a Jinja
    template over the example's fields (the word as sentence 1 spells it, by its span); a text field
    is its text as the card reads it; a field the example lacks, or a template Jinja cannot read,
    is one sentence."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.eval.suite_file import load_suite
    from tests.helpers import ROOT

    suite = load_suite(ROOT / "configs/suites/superglue.yaml")
    entry = next(t for t in suite.tasks if t.card.endswith("wic.yaml"))
    task, spec = load_card(entry.card), entry.zero_shot
    check_method(task, spec)
    row = {"word": "bank", "sentence1": "We sat on the banks.", "sentence2": "The bank lends money.",
           "start1": 14, "end1": 19, "idx": 0, "label": False}  # fmt: skip
    assert spec.text(task, row) == (
        "Sentence 1: We sat on the banks.\nSentence 2: The bank lends money.\n"
        "Question: Is the word 'banks' used in the same way in the two sentences above?\nAnswer:"
    )
    assert spec.verbalizers == [" no", " yes"] and task.labels == ["False", "True"]
    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    lacking = {k: v for k, v in row.items() if k != "end1"}
    lacks = (
        r"^task 'wic': example 1: the zero_shot template names 'end1', which the example lacks \(its fields: "
    )
    with pytest.raises(TaskDataError, match=lacks + r"'word', 'sentence1', 'sentence2', 'start1', "):
        scorer.verbalizers(task, spec, [lacking])
    with pytest.raises(
        ValueError, match=r"zero_shot of task 'wic': the template is not Jinja's \(.+, line 1\)"
    ):
        check_method(task, ZeroShot(template="{{ sentence1 ", verbalizers=[" no", " yes"]))
    with pytest.raises(
        TaskDataError, match=r"^task 'wic': example 1: the zero_shot template cannot be filled in: "
    ):
        scorer.verbalizers(
            task, ZeroShot(template="{{ sentence1[word:] }}", verbalizers=[" no", " yes"]), [row]
        )
    stripped = ZeroShot(template="[{{sentence}}]", verbalizers=[" a", " b"])  # the card's reading: stripped
    sst2 = load_card(ROOT / "tasks/glue/sst2.yaml")
    assert stripped.text(sst2, {"sentence": "it 's fine . ", "label": 1}) == "[it 's fine .]"


# lm-evaluation-harness 0.4.13's WSC prompts (`preprocess_wsc.default_doc_to_text`, run on these rows)
WSC = [
    ("Mark told Pete many lies about himself, which Pete included in his book. He should have been more "
     "skeptical.", 13, "He", "Pete",
     "Passage: Mark told Pete many lies about himself, which Pete included in his book. *He* should have "
     "been more skeptical."),
    ("The trophy does n't fit into the brown suitcase because it is too large .", 10, "it", "The trophy",
     "Passage: The trophy doesn't fit into the brown suitcase because *it* is too large."),
    ('"Ann said ( quietly ) that she , too , was there .', 6, "she", "Ann",
     'Passage: "Ann said (quietly) that *she*, too, was there.'),
]  # fmt: skip


def test_wsc_is_asked_as_the_harness_asks_it_from_either_layout(monkeypatch, tmp_path):
    """The suite's Jinja template marks the pronoun in the passage as the harness's Python does,
    from the release's records (spans in `target`) and the hub's rows (flat columns the card
    renames to `target.*`) alike, each read as a run reads its split."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.files import examples_split
    from gpt_ft.eval.suite_file import load_suite
    from tests.helpers import ROOT, read_alike

    entry = next(
        t for t in load_suite(ROOT / "configs/suites/superglue.yaml").tasks if t.card.endswith("wsc.yaml")
    )
    task, spec = load_card(entry.card), entry.zero_shot
    check_method(task, spec)
    records = [
        {"text": text, "idx": i, "label": True,
         "target": {"span1_text": noun, "span2_text": pronoun, "span1_index": 0, "span2_index": at}}
        for i, (text, at, pronoun, noun, _) in enumerate(WSC)
    ]  # fmt: skip
    flat = lambda r: [{"text": r["text"], **r["target"], "idx": r["idx"], "label": int(r["label"])}]  # noqa: E731
    hub = read_alike(task, monkeypatch, tmp_path / "WSC" / "val.jsonl", records, flat)
    released = list(examples_split(task, "validation", tmp_path))
    for (_, _, pronoun, noun, passage), a, b in zip(WSC, released, hub, strict=True):
        question = f'Question: In the passage above, does the pronoun "*{pronoun}*" refer to "*{noun}*"?'
        assert spec.text(task, a) == spec.text(task, b) == f"{passage}\n{question}\nAnswer:"


def test_a_verbalizer_the_tokenizer_merges_into_the_text_is_named():
    """Encoded after "hello wor", "ld" has no tokens of its own ("Ġworld" is one): it reached the
    scoring as a bare "A continuation to score has no tokens", naming no task or example."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from gpt_ft.adapters import SingleText

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        ["hello world"] * 50, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    task = SingleText(name="s", labels=["neg", "pos"])
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    assert scorer.pair("hello wor", "ld")[1] == []  # the whole text's last token is "Ġworld"
    spec = ZeroShot(verbalizers=["ld", " x"])
    with pytest.raises(
        TaskDataError, match=r"^task 's': example 1: the verbalizer 'ld' has no tokens of its own"
    ):
        scorer.verbalizers(task, spec, [{"sentence": "hello wor", "label": "pos"}])
