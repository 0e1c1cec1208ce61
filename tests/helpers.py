"""Helpers shared by the tests: a micro model's shape, data files and task cards, the arguments of a
quick run, tiny models, corpora and suite files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tasks"
TASK_CARDS = sorted(p.relative_to(TASKS).with_suffix("").as_posix() for p in TASKS.rglob("*.yaml"))
"""Every task card under tasks/, e.g. glue/rte."""
MICRO = "{n_positions: 64, n_embd: 32, n_layer: 1, n_head: 2}"


def write_rows(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    delimiter = "\t" if path.suffix == ".tsv" else ","
    with path.open("w", newline="") as f:
        writer = csv.writer(
            f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
        )
        writer.writerow(header)
        writer.writerows(rows)


def data_args(**values) -> str:
    """`--data={KEY: VALUE, ...}`: the data module's options as one (a parse takes each `--data.KEY`
    through the whole data module and its card again; one mapping, once)."""
    return f"--data={json.dumps({key: str(v) if isinstance(v, Path) else v for key, v in values.items()})}"


def fit_and_last_validation(card: Path, tokenizer_dir: str, root: Path, *more: str) -> tuple[dict, Path]:
    """`gpt-ft fit` of `card` on root's files (`common_args`, 2 epochs at lr 1e-2): the metrics its
    last validation logged, by name, and its last checkpoint."""
    from gpt_ft.cli import main

    main(["fit", *common_args(card, tokenizer_dir, root), "--trainer.max_epochs=2", "--model.lr=1e-2", *more])
    with next((root / "runs").rglob("metrics.csv")).open() as f:
        validated = [
            r for r in csv.DictReader(f) if any(v for k, v in r.items() if k.startswith("validation/"))
        ]
    return validated[-1], next((root / "runs").rglob("last.ckpt"))


def write_release(folder: Path, splits: dict[str, list[dict]]) -> None:
    """A release's JSON-lines files, `folder/{split}.jsonl`, a record a line."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, records in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def read_alike(task, monkeypatch, path: Path, records: list[dict], hub_rows) -> list[dict]:
    """The validation split of a release's `records` (written to `path`, under the card's folder) and
    of the hub's rows they make (`hub_rows(record)`), asserted the same examples: the hub's."""
    import datasets

    from gpt_ft.data.files import examples_split

    write_release(path.parent, {path.stem: records})
    released = examples_split(task, "validation", path.parent.parent)
    rows = [row for record in records for row in hub_rows(record)]
    with monkeypatch.context() as patched:
        patched.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
        hub = examples_split(task, "validation", None)
    assert len(released) == len(hub)
    for a, b in zip(released, hub):
        assert task.texts(a) == task.texts(b)
        torch.testing.assert_close(
            torch.tensor(task.output.example_label(a)),
            torch.tensor(task.output.example_label(b)),
            equal_nan=True,
        )
    return list(hub)


def data_of(args: list[str]) -> dict:
    """The `--data={...}` mapping in `args` (`gpt-ft suite` gives each run's data options so)."""
    return json.loads(next(a for a in args if a.startswith("--data=")).removeprefix("--data="))


def common_args(card: Path, tokenizer_dir: str, root: Path) -> list[str]:
    return [
        data_args(task=card, tokenizer=tokenizer_dir, data_dir=root, batch_size=4, max_length=64),
        "--model.preset=gpt-micro",
        f"--model.overrides={MICRO}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]


# ---- small tasks of each kind, in files (tsv; csv for multiple choice) ----

SMALL_CARDS = {
    "single": """class_path: gpt_ft.adapters.SingleText
init_args:
  name: sent
  labels: [negative, positive]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv, test: d/test.tsv}, columns: {index: idx}}
  submission_files: {test: SENT.tsv}
""",
    "pair": """class_path: gpt_ft.adapters.TextPair
init_args:
  name: pair
  premise: sentence1
  hypothesis: sentence2
  labels: [entailment, not_entailment]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv, test: d/test.tsv}, columns: {index: idx}}
""",
    "similarity": """class_path: gpt_ft.adapters.Similarity
init_args:
  name: sts
  regression: true
  score_range: [0, 5]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv, test: d/test.tsv}, columns: {index: idx}}
  submission_files: {test: STS-B.tsv}
""",
    "choice": """class_path: gpt_ft.adapters.MultipleChoice
init_args:
  name: mc
  context: [story]
  choices: [end1, end2]
  labels: ['1', '2']
  index: id
  local: {splits: {train: d/train.csv, validation: d/dev.csv, test: d/test.csv}}
""",
}


GOOD, BAD = "the cat sat on the mat .", "two dogs run in a park ."
"""`make_task`'s texts: odd rows hold the first, even rows the second."""


def make_task(kind: str, root: Path) -> Path:
    """A task of `kind` (SMALL_CARDS) under `root`: 6 train, 5 dev and 3 unlabelled test rows; its card."""
    good, bad = GOOD, BAD
    for split, n in (("train", 6), ("dev", 5), ("test", 3)):
        labelled = split != "test"
        if kind == "single":
            rows = [[i, good if i % 2 else bad, i % 2] for i in range(n)]
            header = ["index", "sentence", "label"]
        elif kind == "pair":
            rows = [[i, good, bad, ["entailment", "not_entailment"][i % 2]] for i in range(n)]
            header = ["index", "sentence1", "sentence2", "label"]
        elif kind == "similarity":
            rows = [[i, good, bad, f"{i % 5}.5"] for i in range(n)]
            header = ["index", "sentence1", "sentence2", "label"]
        else:
            rows = [[f"s-{i}", good, "He is happy now.", "He joined a gang.", 1 + i % 2] for i in range(n)]
            header = ["id", "story", "end1", "end2", "label"]  # text ids, as Story Cloze's
        if not labelled:
            header, rows = header[:-1], [r[:-1] for r in rows]
        write_rows(root / "d" / f"{split}.{'csv' if kind == 'choice' else 'tsv'}", header, rows)
    card = root / f"{kind}.yaml"
    card.write_text(SMALL_CARDS[kind])
    return card


def finetune_args(card: Path, tokenizer_dir: str, root: Path, logs: Path) -> list[str]:
    """A 3-epoch fine-tuning run of make_task's 6 examples, 2 a batch (3 batches an epoch), seeded."""
    return [
        data_args(task=card, tokenizer=tokenizer_dir, data_dir=root, batch_size=2, max_length=64),
        "--model.preset=gpt-micro",
        f"--model.overrides={MICRO}",  # dropout 0.1: the resumed run must redraw the same masks
        "--trainer.max_epochs=3",
        "--seed_everything=3",
        f"--trainer.logger.init_args.save_dir={logs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]


# ---- a text pair task in local TSVs (a quote, an empty premise, an unlabelled test split) ----

PAIR_ROWS = {
    "train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tThe cat sat.\tA cat sat.\tentailment\n"
    '1\tHe said "yes.\tNo dogs.\tnot_entailment\n2\t\tEmpty premise.\tentailment\n',
    "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tTwo dogs run.\tDogs run.\tentailment\n",
    "test.tsv": "index\tsentence1\tsentence2\n5\tIs it true?\tYes.\n6\tNo.\tIt is.\n",
}

PAIR_CARD = """class_path: gpt_ft.adapters.TextPair
init_args:
  name: pairs
  premise: sentence1
  hypothesis: sentence2
  labels: [entailment, not_entailment]
  local:
    splits: {train: PAIRS/train.tsv, validation: PAIRS/dev.tsv, test: PAIRS/test.tsv}
    columns: {index: idx}
"""


# ---- a text pair task whose sentences vary in length (2 to 10 words) ----

WORDS = "the cat sat on a mat two dogs run in park he is happy now she bakes brownies".split()
VARIED_PAIR_CARD = """class_path: gpt_ft.adapters.TextPair
init_args:
  name: pair
  premise: sentence1
  hypothesis: sentence2
  labels: [entailment, not_entailment]
  test_splits: [test, one]
  local:
    splits: {train: train.tsv, validation: dev.tsv, test: test.tsv, one: one.tsv}
    columns: {index: idx}
"""


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 9))  # 2 to 10 words


def write_varied_pairs(root: Path) -> Path:
    """16 training examples (2 steps of 8 per epoch); 7 validation and 5 test examples, which
    2 ranks cannot split evenly, and a test split of 1, fewer than the ranks. Returns the card."""
    for split, n in (("train", 16), ("dev", 7), ("test", 5), ("one", 1)):
        rows = [
            [str(i), sentence(i), sentence(i + 3), ["entailment", "not_entailment"][i % 3 % 2]]
            for i in range(n)
        ]
        header = ["index", "sentence1", "sentence2", "label"]
        if split in ("test", "one"):
            header, rows = header[:-1], [r[:-1] for r in rows]
        (root / f"{split}.tsv").write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    card = root / "pair.yaml"
    card.write_text(VARIED_PAIR_CARD)
    return card


# ---- a text corpus for pretraining ----

SENTENCES = [
    "The cat sat on the mat.",
    "A man is playing a guitar.",
    "Two dogs run in a park.",
    "She decides to bake a batch of brownies for the party.",
    "He is happy now.",
]


def write_corpus(root: Path, n_files: int = 4, lines: int = 30) -> Path:
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(n_files):
        text = "\n".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(lines)) + "\n"
        (corpus / f"book{i}.txt").write_text(text)
    return corpus


# ---- multiple choice rows of random tokens ----


def random_choice_examples(
    specials, vocab: int, n: int = 6, seed: int = 0, context_length: int | None = None
) -> tuple[list[dict], object]:
    """Encoded rows of random tokens: contexts of 1-40 tokens (or all of `context_length`), 1-4
    choices of 0-9 tokens."""
    from gpt_ft.adapters import MultipleChoice

    g = torch.Generator().manual_seed(seed)
    task = MultipleChoice(name="mc", context=["story"], choices="endings", num_choices=4)
    rows = []
    for i in range(n):
        randint = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))  # noqa: E731
        length = randint(1, 40) if context_length is None else context_length
        context = torch.randint(0, vocab, (length,), generator=g).tolist()
        choices = [
            torch.randint(0, vocab, (randint(0, 9),), generator=g).tolist() for _ in range(randint(1, 4))
        ]
        label = randint(0, len(choices) - 1)
        enc = task.encode({"label": label}, [context, *choices], specials, max_length=64)
        rows.append(
            {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": enc.label, "index": i}
        )
    assert {len(r["input_ids"]) for r in rows} != {4}  # some rows have fewer choices
    return rows, task


# ---- suites ----


def as_list(*values: str) -> str:
    """Values as one list argument in jsonargparse's syntax (`--data_dir [a, t=b]`)."""
    return json.dumps(list(values))


def fit_args(*args: str) -> list[str]:
    """`gpt-ft suite`'s arguments for every fit: `--fit_args [ARG, ...]`."""
    return ["--fit_args", as_list(*args)]


def write_suite(root: Path, body: str) -> Path:
    path = root / "suite.yaml"
    path.write_text(body)
    return path


# ---- tiny models, ours and transformers' ----

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
"""Marks a test that runs on a GPU (its name says cuda: `pytest -k cuda` selects them)."""


def trainer_on(device: str):
    """The parts of a trainer on `device` that a data module's loaders read."""
    from types import SimpleNamespace

    strategy = SimpleNamespace(root_device=torch.device(device))
    return SimpleNamespace(strategy=strategy, world_size=1, global_rank=0)


TINY = dict(vocab_size=101, n_positions=64, n_embd=32, n_layer=2, n_head=4)


def hf_families() -> dict:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPT2Model,
        OpenAIGPTConfig,
        OpenAIGPTLMHeadModel,
        OpenAIGPTModel,
    )

    return {
        "openai-gpt": (OpenAIGPTConfig, OpenAIGPTLMHeadModel, OpenAIGPTModel),
        "gpt2": (GPT2Config, GPT2LMHeadModel, GPT2Model),
    }


FAMILIES = ["openai-gpt", "gpt2"]


def tiny_hf(family: str, base: bool = False, **overrides):
    config_cls, lm_cls, base_cls = hf_families()[family]
    torch.manual_seed(0)
    config = config_cls(**{**TINY, **overrides}, bos_token_id=0, eos_token_id=0)
    return (base_cls if base else lm_cls)(config).eval()


LLAMA_FAMILIES = ["llama", "qwen2", "mistral"]
NEW_FAMILIES = ["qwen3", "gemma3_text", "phi3", "smollm3", "olmo2", "olmo3"]
# (an epsilon no config class defaults to: a setting exported under another family's name, which a
# config class takes without a word and ignores, shows in the round trips)
TINY_LLAMA = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=3e-5)  # fmt: skip
# Each family's own traits at the tiny size: Qwen3's and Gemma 3's heads are not hidden / heads wide;
# Gemma 3's first layer slides over 8 tokens (rotary base 10,000) and its second sees all (base 1e6);
# SmolLM3's second layer takes no rotary positions, its first turns with base 10,000 (its config's 2e6
# barely turns an 8-wide head), and its config's default token ids are past the tiny vocabulary; so are
# OLMo's, whose rotary base is 10,000 here (500,000 by default), OLMo 3's first layer sliding over 8.
_TRAITS = {
    "qwen3": dict(head_dim=16),
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=12, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"],
                        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
    "phi3": dict(pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "smollm3": dict(no_rope_layers=[1, 0], rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "olmo2": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=None,
                  bos_token_id=None, eos_token_id=None),
    "olmo3": dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"], pad_token_id=None,
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                  bos_token_id=None, eos_token_id=None),
}  # fmt: skip
_CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "qwen3": "Qwen3", "phi3": "Phi3",
            "gemma3_text": "Gemma3Text", "smollm3": "SmolLM3", "olmo2": "Olmo2",
            "olmo3": "Olmo3"}  # fmt: skip


def tiny_llama(model_type: str, base: bool = False, **overrides):
    """A random transformers Llama, Qwen2, Mistral, Qwen3, Gemma 3, Phi-3, SmolLM3, OLMo 2 or OLMo 3
    model (grouped-query attention: 4 heads, 2 for keys/values), its weights drawn wider than the
    default init so that differences show."""
    import transformers

    prefix = _CLASSES[model_type]
    config = getattr(transformers, prefix + "Config")(
        **{**TINY_LLAMA, **_TRAITS.get(model_type, {}), **overrides}
    )
    torch.manual_seed(0)
    lm = "Gemma3ForCausalLM" if model_type == "gemma3_text" else prefix + "ForCausalLM"
    model = getattr(transformers, prefix + "Model" if base else lm)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


# (no bos or eos ids: generation runs its whole length, on either side)
TINY_NEOX = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=64, layer_norm_eps=3e-5,
                 bos_token_id=None, eos_token_id=None)  # fmt: skip
# Half of each 8-wide head turns (Pythia's config turns a quarter: one pair of 8), at base 10,000.
NEOX_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}


def tiny_neox(base: bool = False, **overrides):
    """A random transformers GPT-NeoX model (Pythia's blocks: LayerNorm, biases, attention and MLP side
    by side, rotary positions on half of each head), its weights drawn wide as `tiny_llama`'s."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXModel

    config = GPTNeoXConfig(**{**TINY_NEOX, "rope_parameters": dict(NEOX_ROPE), **overrides})
    torch.manual_seed(0)
    model = (GPTNeoXModel if base else GPTNeoXForCausalLM)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


# The micro Llama preset with Qwen3's, Gemma 3's, SmolLM3's, GPT-NeoX's or OLMo's switches on (Gemma's
# and OLMo 3's first layer slides over 6 tokens; SmolLM3's first takes no rotary positions; GPT-NeoX
# turns 4 of each 16-wide head).
QWEN3_MICRO = dict(head_size=24, qk_norm=True)
SMOLLM3_MICRO = dict(nope_layers=[0], hf_model_type="smollm3")
GEMMA3_MICRO = dict(QWEN3_MICRO, norm="gemma_rmsnorm", post_norms=True, scale_embeddings=True,
                    activation="gelu_tanh", query_pre_attn_scalar=20, sliding_window=6, rope_local_theta=1e4,
                    layer_types=["sliding_attention", "full_attention"])  # fmt: skip
NEOX_MICRO = dict(norm="layernorm", activation="gelu", gated_mlp=False, bias=True, n_kv_head=None,
                  tie_embeddings=False, rotary_dim=4, parallel_residual=True,
                  hf_model_type="gpt_neox")  # fmt: skip
# Phi-4-mini's: three quarters of each 16-wide head turn, LongRoPE past an original context of 20
PHI4_MICRO = dict(rotary_dim=12, hf_model_type="phi3", rope_scaling=dict(
    rope_type="longrope", short_factor=[1.0, 1.5, 2.0, 3.0, 4.0, 6.0],
    long_factor=[1.0, 4.0, 8.0, 16.0, 32.0, 64.0], original_max_position_embeddings=20))  # fmt: skip
OLMO2_MICRO = dict(norm="rmsnorm_fp32", input_norms=False, post_norms=True, qk_norm=True,
                   qk_norm_span="all_heads", hf_model_type="olmo2")  # fmt: skip
OLMO3_MICRO = dict(OLMO2_MICRO, sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                   hf_model_type="olmo3")  # fmt: skip
FAMILY_MICRO = {"llama-micro": ("llama-micro", {}), "qwen3-micro": ("llama-micro", QWEN3_MICRO),
                "gemma3-micro": ("llama-micro", GEMMA3_MICRO),
                "smollm3-micro": ("llama-micro", SMOLLM3_MICRO),
                "neox-micro": ("llama-micro", NEOX_MICRO),
                "olmo2-micro": ("llama-micro", OLMO2_MICRO),
                "phi4-micro": ("llama-micro", PHI4_MICRO)}  # fmt: skip


def tiny_gpt(**overrides):
    from gpt_ft import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


def assert_classifier_agrees(ckpt: Path, root: Path, predictions: Path) -> None:
    """`Classifier.from_checkpoint(ckpt)` on the test rows of `make_task`'s data in `root`: the labels
    of `gpt-ft predict`'s file `predictions`, and the probabilities of the data module's own batches
    (its encoding and collation) to 1e-5."""
    import torch

    from gpt_ft import Classifier
    from gpt_ft.data.files import read_table
    from gpt_ft.data.task_data import TaskDataModule

    clf = Classifier.from_checkpoint(ckpt, device="cpu")
    task = clf.task
    results = clf.predict(read_table(next((root / "d").glob("test.*"))).to_list(), batch_size=2)
    predicted = [line.split("\t")[1] for line in predictions.read_text().splitlines()[1:]]
    # The small cards write label names (no submission_labels), scores as float32 reads them.
    if task.regression:
        assert [float(p) for p in predicted] == pytest.approx([r["label"] for r in results], abs=1e-6)
    else:
        assert [r["label"] for r in results] == predicted
    tokenizer = str(ckpt.parent / "tokenizer")
    data = TaskDataModule(task, tokenizer, data_dir=str(root), max_length=64, eval_batch_size=len(results))
    data.setup("predict")
    with torch.inference_mode():
        expected = clf.head.probabilities(clf.outputs(next(iter(data.predict_dataloader()[0]))))
    for result, row in zip(results, expected):
        scores = result["scores"]
        got = torch.tensor([scores] if task.regression else list(scores.values()))
        torch.testing.assert_close(got, row.reshape(-1)[: len(got)], rtol=0, atol=1e-5)


def write_solutions(path: Path, n: int, seed: int) -> None:
    """Solutions of 1-4 steps "add k", right unless a step says "lose"; ProcessBench's layout (a
    first wrong step counted from 0, -1 for none): a JSON list, or JSON lines for a .jsonl path."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        steps = [
            f"add {int(torch.randint(1, 9, (), generator=g))} ."
            for _ in range(int(torch.randint(1, 5, (), generator=g)))
        ]
        first = int(torch.randint(-1, len(steps), (), generator=g))
        if first >= 0:
            steps[first] = "lose all ."
        rows.append({"id": f"q{i}", "problem": f"start at {i % 7} .", "steps": steps, "label": first})
    text = "".join(json.dumps(r) + "\n" for r in rows) if path.suffix == ".jsonl" else json.dumps(rows)
    path.write_text(text)


def write_rankings(path: Path, n: int, seed: int) -> None:
    """Lists of 2-4 replies "add k ." to a prompt, scored k (ties where k repeats), JSON lines."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ks = torch.randint(1, 6, (int(torch.randint(2, 5, (), generator=g)),), generator=g).tolist()
        rows.append({"prompt": f"start at {i % 7} .", "replies": [f"add {k} ." for k in ks], "scores": ks})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


class HostReads(torch.overrides.TorchFunctionMode):
    """Records the calls that, on a GPU, make the host wait for the device: a value read back
    (`.item()`, `bool(t)`, `.tolist()`, `.cpu()`), an output whose size depends on the values
    (`nonzero`, `unique`, `masked_select`, `t[mask]`), or a tensor made from host values on a device
    (`torch.tensor(x, device=d)`: its copy waits for the device's queue). On a CPU they cost
    nothing, so this is how a test there keeps them out of a training step's path."""

    NAMES = frozenset("item tolist cpu numpy __bool__ __int__ __float__ nonzero argwhere unique "
                      "unique_consecutive masked_select".split())  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name == "__getitem__" and len(args) > 1 else None
        indices = index if isinstance(index, tuple) else (index,)
        made_on_device = name in ("tensor", "as_tensor") and (kwargs or {}).get("device") is not None
        if (
            name in self.NAMES
            or made_on_device
            or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        ):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))
