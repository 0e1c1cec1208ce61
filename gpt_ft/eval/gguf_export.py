"""A model as one GGUF file, by way of the transformers folder `gpt-ft export` writes: a language
model (pretraining's checkpoint) for llama.cpp, Ollama and LM Studio; an embedding model for
`llama-server --embeddings` (and `llama-embedding`); a Qwen3 model scoring a pair of texts (a
reranker, or a pair task of one score or two classes) for `llama-server --reranking`.

    gpt-ft export --ckpt_path runs/.../last.ckpt --format gguf --out my-embedder.gguf

An embedding model's file pools as its card does (llama.cpp's `last` for the extract token and the
text's last token, `mean` for the mean of `[start] text`), its start token added before each text and
its extract token after it (the file's bos and eos); llama.cpp normalises the vector. A projection
(`dimensions`) has no place in llama.cpp's pooling: refused. A pair's file scores
`[start] query [delim] document [extract]` (its `rerank` prompt) at the extract token with llama.cpp's
Qwen3 reranker head, the first of the softmax of two rows: for one score, the head's and a row of
zeros (llama.cpp's score is the sigmoid of gpt_ft's: the same order of the documents); for two
classes, the second's and the first's (the second class's probability). llama.cpp reads that head in
Qwen3 models only; other families' are refused, as are the other tasks' heads (llama.cpp serves
none). Prompts, the card's stripping and its cut are the caller's: llama.cpp takes texts as given."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch

from gpt_ft.adapters.base import TaskAdapter
from gpt_ft.eval.classifier import Classifier
from gpt_ft.eval.framing import head_weights, language_model
from gpt_ft.eval.labelling import put_in_place
from gpt_ft.weights.gguf_write import Serving, write_gguf


def export_served_gguf(clf: Classifier, out: Path, gguf_type: str = "f16") -> Path:
    """A fine-tuned embedding model or Qwen3 pair scorer (a reranker) as one GGUF file llama.cpp serves."""
    lm, serving = language_model(clf), serving_of(clf)
    tokenizer = copy.deepcopy(clf.tokenizer)
    tokenizer.chat_template = None  # (texts are not chats: the file names no template but a reranker's)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "model"
        lm.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return place_gguf(folder, out, gguf_type, serving)


def place_gguf(folder: Path, out: Path, gguf_type: str, serving: Serving | None = None) -> Path:
    """The scratch transformers folder `folder` as GGUF file `out`, which takes its name once whole
    and only where no file has it: one another process wrote meanwhile is kept, not replaced."""
    try:
        return write_gguf(folder, out, outtype=gguf_type, serving=serving, place=_new_name)
    except ValueError as error:  # (what is refused is the checkpoint's, not the scratch folder's)
        raise ValueError(str(error).removeprefix(f"{folder}: ")) from None


def _new_name(file: Path, out: Path) -> None:
    put_in_place(file, out, overwrite=False, option="--out")


def check_served(task: TaskAdapter, dimensions: int | None = None) -> None:
    """Refuses, in one sentence, a task whose model llama.cpp does not serve: an embedding model
    that projects (to the card's `dimensions`, or those given: its head's), any task but an embedding
    model's and a pair's score (`scores_a_pair`). From the card alone, before any weights load."""
    dimensions = dimensions if dimensions is not None else getattr(task, "dimensions", None)
    if task.output.embeds and dimensions is not None:
        raise ValueError(
            f"--format gguf: llama.cpp reads an embedding as the model's pooled state, with no "
            f"projection after it; task {task.name!r} projects to {dimensions} dimensions "
            "(export it as a sentence-transformers folder)."
        )
    if not task.output.embeds and not scores_a_pair(task):
        raise ValueError(
            f"--format gguf: llama.cpp serves language models, embedding models and scores of a pair of "
            f"texts (rerankers, and pair tasks of one score or two classes); task {task.name!r} "
            f"({task.output.kind}) exports as a transformers or ONNX folder."
        )


def serving_of(clf: Classifier) -> Serving:
    """How llama.cpp serves `clf`'s task (`write_gguf` says which families it serves them in)."""
    task, specials = clf.task, clf.specials
    check_served(task, clf.head.out_features if getattr(clf.head, "projects", False) else None)
    if task.output.embeds:
        extract = specials.extract if task.pooling == "extract" else None
        return Serving("mean" if task.pooling == "mean" else "last", specials.start, extract)
    weight, bias = head_weights(clf)
    scores = pair_scores(clf, weight)
    ids = (specials.start, specials.delim, specials.extract)
    _, pair = task.template(clf.tokenizer.convert_ids_to_tokens(list(ids)))
    texts = {"$A": "{query}", "$B": "{document}"}  # (llama.cpp reads the special tokens in it as such)
    prompt = "".join(texts.get(piece, piece) for piece in pair.split())
    names = task.output.served_labels()
    labels = [names[1], names[0]] if len(scores) == len(names) == 2 else ["score", "zero"]
    return Serving("rank", specials.start, specials.extract, scores, prompt, bias is not None, labels)


def scores_a_pair(task: TaskAdapter) -> bool:
    """Whether `task` scores a pair of texts in one sequence as llama.cpp's reranker head can answer:
    one score (a reranker's, a regression's) or two classes."""
    output = task.output
    pair = output.reranks or (task.num_sequences == 1 and len(task.text_groups) == 2)
    if not pair or task.renders_chats:
        return False
    if output.num_outputs == 1:
        return output.reranks or output.problem_type == "regression"
    return output.num_outputs == 2 and output.problem_type == "single_label_classification"


def pair_scores(clf: Classifier, weight: torch.Tensor) -> torch.Tensor:
    """The two rows whose softmax llama.cpp's Qwen3 reranker head answers the first of, for a task
    that `scores_a_pair`: one score z, as the rows (z, 0), whose first is sigmoid(z); two classes, as
    the second's and the first's logits, whose first is the second class's probability."""
    if weight.shape[0] == 1:
        return torch.cat([weight, torch.zeros_like(weight)]).float().cpu()
    return weight.flip(0).float().cpu()
