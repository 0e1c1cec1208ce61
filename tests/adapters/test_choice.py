import numpy
import pytest

from gpt_ft.adapters import ChoiceHead, MultipleChoice, TaskDataError
from gpt_ft.data.tokenizer import SpecialTokenIds

SPECIALS = SpecialTokenIds(start=100, delim=101, extract=102, pad=103, eos=None)
START, DELIM, EXTRACT, PAD = 100, 101, 102, 103


def test_multiple_choice_layout_and_shared_truncated_context():
    mc = MultipleChoice(name="t", context=["story"], choices=["a", "b"], labels=["1", "2"])
    example = {"story": "x", "a": "y", "b": "z", "label": "2"}
    enc = mc.encode(example, [[1, 2, 3], [7], [8, 9]], SPECIALS, 512)
    assert enc.sequences == [[START, 1, 2, 3, DELIM, 7, EXTRACT], [START, 1, 2, 3, DELIM, 8, 9, EXTRACT]]
    assert enc.extract_index == [6, 7] and enc.label == 1
    assert mc.num_sequences == 2 and isinstance(mc.head(8, dropout=0.0, init_std=0.02), ChoiceHead)
    # Context 20 and longest answer 4 into a budget of 7: context 4, answers at most 3, the same
    # context tokens in every choice.
    enc = mc.encode(example, [list(range(1, 21)), [7], [8, 9, 10, 11]], SPECIALS, 10)
    assert enc.sequences == [
        [START, 1, 2, 3, 4, DELIM, 7, EXTRACT],
        [START, 1, 2, 3, 4, DELIM, 8, 9, 10, EXTRACT],
    ]
    assert all(len(s) <= 10 for s in enc.sequences)


def test_multiple_choice_texts_join_context_fields_and_read_list_fields():
    mc = MultipleChoice(name="race", context=["article", "question"], choices="options", num_choices=4)
    row = {"article": "A long story.", "question": "Who?", "options": ["Ann", "Bob", "Cy"], "label": 2}
    assert mc.texts(row) == ["A long story.", " Who?", "Ann", "Bob", "Cy"]
    assert mc.context_and_choices(row) == ("A long story. Who?", ["Ann", "Bob", "Cy"])
    assert mc.context_and_choices({**row, "article": ""})[0] == "Who?"
    with pytest.raises(TaskDataError, match="must hold a list of 1 to 4 choices"):
        mc.texts({**row, "options": "Ann"})
    # A csv's or tsv's cell holds a list as JSON, as `gpt-ft label` writes one (it was one text)
    assert mc.texts({**row, "options": '["Ann", "Bob", "Cy"]'}) == mc.texts(row)
    with pytest.raises(TaskDataError, match="must hold a list of 1 to 4 choices"):
        mc.texts({**row, "options": "[Ann, Bob]"})  # no JSON: a text
    with pytest.raises(TaskDataError, match=r"^field 'options' holds a list \['x'\], not a text\.$"):
        mc.texts({**row, "options": ["Ann", ["x"]]})
    fields = MultipleChoice(name="copa", context=["premise"], choices=["choice1", "choice2"], num_choices=2)
    with pytest.raises(TaskDataError, match=r"^field 'choice2' holds a dict \{'a': 1\}, not a text\.$"):
        fields.texts({"premise": "p", "choice1": "a", "choice2": {"a": 1}})
    with pytest.raises(TaskDataError, match="points past the row's 2 choices"):
        mc.encode({"label": 2}, [[1], [], [2], [3]], SPECIALS, 64)
    # An article of 20 and a question of 3 into a context of 7 (budget 10 - 3 specials, answers 1):
    # the question kept whole, the article cut from its end (the question went first).
    enc = mc.encode({"label": 0}, [list(range(1, 21)), [30, 31, 32], [7], [8]], SPECIALS, 11)
    assert enc.sequences[0] == [START, 1, 2, 3, 4, 30, 31, 32, DELIM, 7, EXTRACT]


def test_strip_texts_strips_each_field_before_the_context_joins(tokenizer_dir):
    """`strip_texts` stripped each part after the join had opened it with a space: training read
    "hungry.He", and zero-shot scoring did not strip at all ("hungry.  He went to the  kitchen")."""
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

    kw = dict(name="t", context=["a", "b"], choices=["c1", "c2"], labels=["1", "2"], label="y")
    row = {"a": "Tom was hungry. ", "b": " He went to the ", "c1": " kitchen. ", "c2": "moon.", "y": "1"}
    clean = {k: v.strip() for k, v in row.items()}
    stripping, plain = MultipleChoice(strip_texts=True, **kw), MultipleChoice(**kw)
    assert (
        stripping.card_texts(row)
        == plain.card_texts(clean)
        == ["Tom was hungry.", " He went to the", "kitchen.", "moon."]
    )
    assert stripping.context_and_choices(row) == ("Tom was hungry. He went to the", ["kitchen.", "moon."])
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    (ours,), (theirs,) = (
        t.encode_examples([r], tok, specials, 64) for t, r in ((stripping, row), (plain, clean))
    )
    assert ours.sequences == theirs.sequences


def test_a_context_of_several_fields_reads_the_tokens_its_whole_text_has():
    """A Llama 2-style tokenizer marks every text's start with "▁": read alone, " too close" began
    with a lone "▁" that "the cat was too close" never has (and an exported model, given the joined
    text, never reads). The parts are the whole text's tokens, split where they meet, and still
    cut part by part; a tokenizer without offsets (a slow one) reads them apart as before."""
    from gpt_ft.adapters.tokens import token_ids
    from tests.eval.test_zeroshot import sentencepiece_style_tokenizer

    tok = sentencepiece_style_tokenizer()
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert tok.convert_ids_to_tokens(ids(" too close"))[0] == "▁"
    mc = MultipleChoice(name="t", context=["a", "b", "c"], choices=["c1", "c2"], labels=["1", "2"], label="y")
    row = {"a": "the cat was", "b": "too close", "c": "", "c1": "the cup", "c2": "the edge", "y": "1"}
    later = {**row, "a": "", "c": "to the edge"}  # the first field empty: the second opens the text
    (first, second), (third, fourth) = (
        mc.encode_examples([r], tok, SPECIALS, 64)[0].sequences for r in (row, later)
    )
    assert first == [START, *ids("the cat was too close"), DELIM, *ids("the cup"), EXTRACT]
    assert third == [START, *ids("too close to the edge"), DELIM, *ids("the cup"), EXTRACT]
    split = token_ids(tok, [mc.card_texts(row)], [3], split_special_tokens=True)
    assert split[:3] == [ids("the cat was"), ids("the cat was too close")[len(ids("the cat was")) :], []]
    cut = mc.encode_examples([row], tok, SPECIALS, 3 + 3 + len(ids("the cup")))[0].sequences[0]  # context 3
    assert cut == [
        START,
        ids("the cat was")[0],
        *ids("the cat was too close")[-2:],
        DELIM,
        *ids("the cup"),
        EXTRACT,
    ]
    slow = type("Slow", (), {"is_fast": False, "__call__": lambda self, texts, **kw: tok(texts, **kw)})()
    assert token_ids(slow, [mc.card_texts(row)], [3], split_special_tokens=True)[1] == ids(" too close")


def test_a_whitespace_token_trimmed_to_nothing_stays_with_its_field():
    """A byte-level tokenizer that trims its offsets (RoBERTa's) gives a lone "Ġ" an empty span at
    its end, which sent it to the next field: the parts are each field's tokens read alone."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from gpt_ft.adapters.tokens import token_ids

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.post_processor = processors.ByteLevel(trim_offsets=True)
    bpe.train_from_iterator(
        ["the cat was here"] * 20, trainers.BpeTrainer(initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    parts = token_ids(tok, [["the cat ", " was"]], [2], split_special_tokens=True)
    assert parts == [ids("the cat "), ids(" was")] and ids("the cat ")[-1] == ids(" ")[0]


def test_bad_cards():
    with pytest.raises(ValueError, match="num_choices. \\(>= 1\\) is required"):
        MultipleChoice(name="t", context=["c"], choices="options")
    with pytest.raises(
        ValueError, match="num_choices. \\(>= 1\\) is required when .choices. is a list field, got -2"
    ):
        MultipleChoice(name="t", context=["c"], choices="options", num_choices=-2)
    with pytest.raises(ValueError, match="`choices` names no field"):
        MultipleChoice(name="t", context=["c"], choices=[])


def test_rows_of_fewer_choices_line_up_across_batches_and_name_their_own(tokenizer_dir):
    """A list field's rows have 2 to 4 choices: each batch's probabilities have the card's 4
    columns (validation concatenates batches), and `Classifier` names a row's own choices only,
    whatever its neighbours."""
    import torch

    from gpt_ft import GPT, GPTConfig
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.classifier import Classifier
    from gpt_ft.training.eval_metrics import EvalMetrics

    task = MultipleChoice(name="mc", context=["story"], choices="endings", num_choices=4)
    head = task.head(8, dropout=0.0, init_std=0.02)
    two, three = head.probabilities(torch.zeros(1, 2)), head.probabilities(torch.zeros(2, 3))
    assert two.shape == (1, 4) and three.shape == (2, 4) and two[0].tolist() == [0.5, 0.5, 0.0, 0.0]
    metric = EvalMetrics(task, lm_coef=0.0)
    for p in (two, three):
        labels = torch.zeros(len(p), dtype=torch.long)
        metric.update(torch.arange(len(p)), torch.zeros(len(p)), torch.ones(len(p)), torch.zeros(len(p)),
                      p.argmax(-1), labels, p)  # fmt: skip
    metric.compute()  # one tensor of every batch's probabilities
    tok = load_tokenizer(tokenizer_dir)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=len(tok))).eval()
    head = task.head(gpt.config.n_embd, dropout=0.0, init_std=0.3)
    clf = Classifier(gpt, head, task, tok, max_length=64, device="cpu")
    rows = [{"story": "the cat", "endings": ["sat", "ran"]}, {"story": "a dog", "endings": list("abcd")}]
    alone, together = clf.predict(rows, batch_size=1), clf.predict(rows, batch_size=2)
    assert [list(o["scores"]) for o in together] == [["0", "1"], ["0", "1", "2", "3"]]
    assert together[0]["scores"] == pytest.approx(alone[0]["scores"], abs=1e-6)


def test_a_nested_field_is_read_by_its_path():
    from gpt_ft.adapters.sources import nested_paths, path_value, with_paths

    arc = {"question": "Q?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B"}
    original = {
        "question": {"stem": "Q?", "choices": [{"text": "a", "label": "1"}, {"text": "b", "label": "2"}]}
    }
    assert path_value(arc, "choices.text") == ["a", "b"] and path_value(arc, "choices.label") == ["A", "B"]
    assert path_value(original, "question.choices.label") == ["1", "2"]  # through a list of records
    assert path_value(original, "question.stem") == "Q?"
    for absent in ("choices.name", "question.stem", "answerKey.x", "nothing.at.all"):
        assert path_value(arc, absent) is None  # read as a missing field's value is
    assert path_value({"choices": None}, "choices.text") is None
    fields = ["question", "choices.text", "choices.label", "answerKey", "other.x"]
    assert nested_paths(fields, list(arc)) == ["choices.text", "choices.label"]  # `other` is no column
    assert nested_paths(["a.b"], ["a.b", "a"]) == []  # a column named with a dot is read as it is
    read = with_paths(arc, fields)
    assert read == {**arc, "choices.text": ["a", "b"], "choices.label": ["A", "B"]}
    assert with_paths(read, fields) == read and with_paths({"question": "Q?"}, fields) == {"question": "Q?"}


def test_a_row_names_its_own_choices():
    """ARC's rows name their choices A to E, some 1 to 4: the label is one of the row's names."""
    from gpt_ft.errors import CardError

    mc = MultipleChoice(name="arc", context=["q"], choices="texts", choice_names="names", num_choices=5,
                        label="key")  # fmt: skip
    row = {"q": "Which?", "texts": ["x", "y", "z"], "names": ["1", "2", "3"], "key": "2"}
    assert mc.read_fields() == ["q", "texts", "key", "idx", "names"]
    enc = mc.encode(row, [[1], [2], [3], [4]], SPECIALS, 64)
    assert enc.label == 1 and len(enc.sequences) == 3
    assert mc.output.example_label({**row, "names": ["A", "B", "C"], "key": " C"}) == 2
    assert mc.output.example_label({**row, "names": [1, 2, 3], "key": 3}) == 2  # numbers, as parquet may hold
    arrays = {
        **row,
        "texts": numpy.array(row["texts"]),
        "names": numpy.array(row["names"]),
    }  # pandas' records
    assert mc.texts(arrays) == mc.texts(row) and mc.output.example_label(arrays) == 1
    for unlabelled in ("", None, -1):  # CommonsenseQA's test split: an empty answerKey
        assert mc.output.example_label({**row, "key": unlabelled}) is None
    assert not mc.output.stratified  # A means a position in its own row only
    with pytest.raises(TaskDataError, match=r"^label 'D' in field 'key' names none of the row's choices "
                       r"\['A', 'B', 'C'\] \(field 'names'\)\.$"):  # fmt: skip
        mc.output.example_label({**row, "names": ["A", "B", "C"], "key": "D"})
    with pytest.raises(
        TaskDataError, match=r"^field 'names' names 2 choices \['1', '2'\], but the row has 3\.$"
    ):
        mc.encode({**row, "names": ["1", "2"]}, [[1], [2], [3], [4]], SPECIALS, 64)
    with pytest.raises(TaskDataError, match=r"^field 'names' names two choices 'A': \['A', 'A', 'B'\]\.$"):
        mc.encode({**row, "names": ["A", "A", "B"]}, [[1], [2], [3], [4]], SPECIALS, 64)
    with pytest.raises(
        TaskDataError, match=r"^field 'names' must hold a list of the choices' names, got ABC\.$"
    ):
        mc.output.example_label({**row, "names": "ABC"})
    with pytest.raises(CardError, match=r"give `labels` .* or `choice_names` .*, not both"):
        MultipleChoice(
            name="arc", context=["q"], choices="t", choice_names="n", num_choices=5, labels=list("ABCDE")
        )
    plain = MultipleChoice(name="race", context=["q"], choices="t", num_choices=4, labels=list("ABCD"))
    assert plain.output.row_names(row) is None and plain.output.stratified
    # fewer names than choices: a prediction of the third choice had no name (IndexError in predict)
    with pytest.raises(
        CardError, match=r"^Task 'mc': `labels` names 2 choices \['1', '2'\], but its rows have 3: "
    ):
        MultipleChoice(name="mc", context=["q"], choices=["a", "b", "c"], labels=["1", "2"])


def test_fill_in_splits_the_sentence_at_its_blank(tokenizer_dir):
    """WinoGrande: [start] the sentence to the blank [delim] option_k + the rest [extract]; zero-shot
    scoring reads (the sentence to the blank + option_k, the rest)."""
    from gpt_ft.adapters import FillIn
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
    from gpt_ft.errors import CardError

    task = FillIn(
        name="wg", sentence="sentence", options=["option1", "option2"], labels=["1", "2"], label="answer"
    )
    row = {"sentence": "The cup fell off the table because the _ was too close to the edge.",
           "option1": "cup", "option2": "table", "answer": "2"}  # fmt: skip
    assert task.texts(row) == [
        "The cup fell off the table because the",
        "cup was too close to the edge.",
        "table was too close to the edge.",
    ]
    assert task.scored_texts(row) == [  # (the rest without its spaces: scored after one, as the harness)
        ("The cup fell off the table because the cup", "was too close to the edge."),
        ("The cup fell off the table because the table", "was too close to the edge."),
    ]
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    (enc,) = task.encode_examples([row], tok, specials, 64)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    before = ids("The cup fell off the table because the")
    assert enc.sequences == [
        [specials.start, *before, specials.delim, *ids("cup was too close to the edge."), specials.extract],
        [specials.start, *before, specials.delim, *ids("table was too close to the edge."), specials.extract],
    ]
    assert (
        enc.label == 1
        and task.shares_context
        and task.read_fields() == ["sentence", "option1", "option2", "answer", "idx"]
    )
    assert task.texts({**row, "sentence": "_ fell."}) == ["", "cup fell.", "table fell."]  # a blank first
    with pytest.raises(TaskDataError, match=r"^field 'sentence' holds no blank '_': 'No blank here\.'\.$"):
        task.texts({**row, "sentence": "No blank here."})
    assert task.texts({**row, "sentence": "Two _ blanks _."}) == ["Two", "cup blanks _.", "table blanks _."]
    with pytest.raises(CardError, match="`blank` must be a text"):
        FillIn(name="wg", sentence="s", options=["a", "b"], blank="", labels=["1", "2"])
    listed = FillIn(name="wg", sentence="s", options="opts", num_choices=3, blank="[MASK]")
    assert listed.texts({"s": "A [MASK] ran.", "opts": ["dog", "cat", "cow"]}) == [
        "A",
        "dog ran.",
        "cat ran.",
        "cow ran.",
    ]


def test_an_export_of_rows_that_name_their_own_choices_says_which_field_names_them(tokenizer_dir):
    """A fixed `choice_labels` (0 to 4) would misname ARC's choices (A to E, or 1 to 4, by row)."""
    from gpt_ft import GPT, GPTConfig
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.classifier import Classifier
    from gpt_ft.eval.export import double_heads_model

    tok = load_tokenizer(tokenizer_dir)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=len(tok))).eval()
    configs = []
    for names in ("choices.label", None):
        task = MultipleChoice(
            name="arc", context=["q"], choices="choices.text", choice_names=names, num_choices=5
        )
        head = task.head(gpt.config.n_embd, dropout=0.0, init_std=0.02)
        configs.append(
            double_heads_model(Classifier(gpt, head, task, tok, max_length=64, device="cpu")).config
        )
    assert configs[0].choice_names_field == "choices.label" and not hasattr(configs[0], "choice_labels")
    assert configs[1].choice_labels == ["0", "1", "2", "3", "4"] and not hasattr(
        configs[1], "choice_names_field"
    )


def test_cause_effect_reads_premise_and_choice_as_one_sentence():
    """COPA as lm-evaluation-harness reads it: the premise's stop dropped, "because" for a cause and
    "therefore" for an effect, each choice's first letter lowered."""
    from gpt_ft.adapters import CauseEffect

    task = CauseEffect(name="copa", label="label")
    row = {"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.",
           "choice2": "The grass was cut.", "question": "cause", "label": 0}  # fmt: skip
    assert task.texts(row) == [
        "My body cast a shadow over the grass because",
        "the sun was rising.",
        "the grass was cut.",
    ]
    assert task.scored_texts({**row, "question": "effect", "premise": "I fell!"}) == [
        ("I fell therefore", "the sun was rising."),
        ("I fell therefore", "the grass was cut."),
    ]
    assert task.text_fields() == ["premise", "choice1", "choice2", "question"]
    enc = task.encode(row, [[1, 2], [3], [4, 5]], SPECIALS, 64)
    assert (
        enc.sequences == [[START, 1, 2, DELIM, 3, EXTRACT], [START, 1, 2, DELIM, 4, 5, EXTRACT]]
        and enc.label == 0
    )
    why = r"^field 'question' is 'why', which the card's connectives do not name: 'cause', 'effect'\.$"
    with pytest.raises(TaskDataError, match=why):
        task.texts({**row, "question": "why"})
    own = CauseEffect(name="c", choices="alts", num_choices=3, connectives={"cause": "since", "effect": "so"})
    assert own.texts({"premise": "Rain", "alts": ["Clouds.", "Sun."], "question": "cause"}) == [
        "Rain since",
        "clouds.",
        "sun.",
    ]
