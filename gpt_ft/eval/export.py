"""A fine-tuned classifier as a standard transformers folder, for any serving stack (and a
pretrained language model as transformers' causal LM, `export_language_model`, or a GGUF file; an
embedding model or Qwen3 reranker (a pair scorer) as a GGUF file, gpt_ft/eval/gguf_export.py).

    gpt-ft export --ckpt_path runs/.../last.ckpt --out my-classifier
    # elsewhere, without gpt_ft:
    pipeline("text-classification", model="my-classifier")("a gripping, funny film", top_k=None)

The folder holds an `OpenAIGPTForSequenceClassification` (GPT-1), `GPT2ForSequenceClassification`
(GPT-2), the Llama family's (`LlamaForSequenceClassification`, Qwen2's, Qwen3's, Mistral's, Phi-3's,
SmolLM3's, OLMo 2's and 3's, `Gemma3TextForSequenceClassification`) or GPT-NeoX's with `id2label`,
`label2id`, `problem_type` and `pad_token_id` set, and the tokenizer with GPT-1's input transform as its
post-processor: `[start] text [extract]` and `[start] premise [delim] hypothesis [extract]`. A reward
model (preference pairs) is one with `num_labels: 1`, the reward of `tokenizer(prompt, reply)`, as
TRL's trainers and vLLM's scoring load them. transformers reads the score at the last token that is
not padding: the extract token, as gpt_ft does.

transformers' score layer has no bias; models without biases (the Llama family) train heads without
one. GPT-1's, GPT-2's and GPT-NeoX's heads have a bias, and their final state goes through a
LayerNorm whose bias nothing else reads (GPT-2's `ln_f`, GPT-NeoX's `final_layer_norm`; GPT-1's last
`ln_2`): the exported model adds δ to that bias, with W δ = b for the head's weight W and bias b (δ =
W⁺ b, exact while the head has no more outputs than the model is wide; a wider one is refused).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Literal

import torch

from gpt_ft.adapters.cards import card_from_value
from gpt_ft.data.folders import written_whole
from gpt_ft.errors import check_output_dir, check_output_file, real_path
from gpt_ft.eval.classifier import Classifier, saved_tokenizer
from gpt_ft.eval.framing import framed_tokenizer, head_weights, language_model, loads_as_written, quiet_saves
from gpt_ft.eval.gguf_export import check_served, export_served_gguf, place_gguf
from gpt_ft.eval.onnx import write_onnx
from gpt_ft.weights.checkpoint import Checkpoint
from gpt_ft.weights.hf import has_double_heads, to_hf
from gpt_ft.weights.pretrained import GPT
from gpt_ft.workarounds.kernels import import_transformers_models

FORMATS = ("transformers", "onnx", "gguf")


@quiet_saves()  # (transformers' bar over the one file it writes)
def export_checkpoint(
    *,
    ckpt_path: str | Path,
    out: str | Path,
    format: Literal["transformers", "onnx", "gguf"] = "transformers",
    gguf_type: Literal["f32", "f16", "bf16", "q8_0"] = "f16",
) -> Path:
    """Write a fine-tuned model or a language model as transformers, ONNX, sentence-transformers or GGUF.

    A classifier: transformers or ONNX (a Qwen3 pair scorer: GGUF too); an embedding model:
    sentence-transformers or GGUF; a reranker: transformers, or GGUF for Qwen3's; a language model
    (pretraining's): transformers or GGUF.

    Args:
        ckpt_path: A checkpoint of gpt-ft fit: fine-tuned, or a language model's (pretraining's).
        out: A new (or empty) folder; with --format gguf, a new file.
        format: transformers (a folder for pipelines), onnx (config, tokenizer and model.onnx), or
            gguf (one file for llama.cpp: a language model, an embedding model, a Qwen3 pair scorer).
        gguf_type: With --format gguf, the matrices' type (norms and biases stay f32).
    """
    gguf = format == "gguf"  # the output checked before the weights load
    out = check_output_file(out, "--out") if gguf else check_new_folder(out, "--out")
    check_format(format)
    stored = Checkpoint.read(ckpt_path)
    if "token_dir" in stored.data_args:  # pretraining's: a language model
        if gguf:
            print(f"wrote {export_gguf(stored, out, gguf_type)}: llama.cpp, Ollama and LM Studio load it")
        elif format == "onnx":
            raise ValueError("--format onnx: a language model exports as a transformers folder or GGUF file.")
        else:
            print(f"wrote {export_language_model(stored, out)}: pipeline('text-generation') loads it")
        return out
    task = card_from_value(stored.require_task_card(), f"The task card recorded in {stored.where}")
    if gguf:  # what the card alone refuses, before the weights load
        check_served(task)
    elif format == "onnx" and task.output.embeds:
        raise ValueError("--format onnx: an embedding model exports as a sentence-transformers folder.")
    clf = Classifier.from_checkpoint(stored, device="cpu")
    if gguf:
        print(f"wrote {export_served_gguf(clf, out, gguf_type)}: {served_by(clf)}")
        return out
    if clf.task.output.embeds:
        written, loads = export_encoder(clf, out), "SentenceTransformer(folder) loads it"
        print(f"wrote {written}: {loads}")
        return written
    written = export_classifier(clf, out, format=format)
    config = json.loads((written / "config.json").read_text(encoding="utf-8"))
    print(f"wrote {written}: {what_loads(config, format)}")
    return written


def what_loads(config: dict, format: str) -> str:
    """What loads an exported folder of this `config.json`, as `gpt-ft export` says it."""
    architecture = (config.get("architectures") or ["?"])[0]
    if format == "onnx":
        return "onnxruntime loads model.onnx"
    if config.get("auto_map"):  # a similarity model: its class is in the folder, which transformers lacks
        return f"pipeline('text-classification', trust_remote_code=True) loads it (its {architecture})"
    if architecture.endswith("ForSequenceClassification"):
        return "pipeline('text-classification') loads it"
    return f"transformers' {architecture} loads it"  # multiple choice, process rewards (a score per step)


def served_by(clf: Classifier) -> str:
    """What serves a fine-tuned model's GGUF file, and what its texts need first (llama.cpp adds no
    prompt, strips nothing and cuts nothing)."""
    task, served = clf.task, "llama-server --embeddings serves it"
    if not task.output.embeds:  # a pair's score: one (the sigmoid of it), or two classes' (the second's)
        names = task.output.served_labels()
        score = f"the probability of {names[1]!r}" if len(names) == 2 else "the sigmoid of gpt_ft's"
        served = f"llama-server --reranking serves it, its score {score}"
    prompts = {kind: getattr(task, f"{kind}_prompt", "") for kind in ("query", "document")}
    needs = [f"before each {kind} {prompt!r}" for kind, prompt in prompts.items() if prompt]
    needs += ["each text stripped"] * task.strip_texts + [f"cut to {clf.max_length} tokens, framed"]
    return f"{served} (its texts as trained: {', '.join(needs)})"


def check_format(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"--format {format!r}: choose transformers, onnx or gguf.")
    if format == "onnx":
        try:
            import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
        except ImportError:
            raise ValueError("--format onnx needs the onnx packages: pip install 'gpt_ft[onnx]'.") from None


def check_new_folder(path: str | Path, option: str) -> Path:
    """An output folder that does not exist or is empty (nothing in it is replaced)."""
    out = check_output_dir(path, option)
    if (real := real_path(out)).is_dir() and any(real.iterdir()):
        raise ValueError(f"{option} {out} is not empty: give a new or empty folder (nothing was written).")
    return out


def export_classifier(clf: Classifier, out: str | Path, *, format: str = "transformers") -> Path:
    """Writes `clf` (weights, head, card and tokenizer) as a transformers sequence classifier, or
    with `format="onnx"` its config, tokenizer and `model.onnx` (dynamic batch and length)."""
    check_format(format)
    task, output = clf.task, clf.task.output
    if output.served_per_token:
        model = token_classifier(clf)
    elif output.problem_type is None and has_double_heads(clf.gpt.config):
        model = double_heads_model(clf)
    elif task.pair_in_both_orders and output.problem_type is not None:
        model = similarity_model(clf)
    elif (task.num_sequences == 1 or output.served_per_sequence) and output.problem_type is not None:
        model = sequence_classifier(clf)
    else:
        why = f"it adds the states of an example's {task.num_sequences} sequences, as none does"
        if output.problem_type is None:
            why = "transformers has multiple-choice models of GPT-1 and GPT-2 only"
        raise ValueError(
            f"Task {task.name!r} ({type(task).__name__}, {output.kind}) has no transformers class to export "
            f"to: {why}; use gpt_ft's Classifier or `gpt-ft label` for it."
        )
    tokenizer = framed_tokenizer(clf, chat_template=clf.task.renders_chats)
    with written_whole(out := Path(out).expanduser()) as tmp:
        if format == "onnx":
            model.config.save_pretrained(tmp)
            write_onnx(model, tokenizer, tmp / "model.onnx")
        else:
            model.save_pretrained(tmp)
        if getattr(model.config, "auto_map", None):  # the model's own class travels with it
            shutil.copy(Path(sys.modules[type(model).__module__].__file__), tmp)
        tokenizer.save_pretrained(tmp)
        loads_as_written(tmp, tokenizer)
    return out


def export_language_model(stored: Checkpoint, out: Path) -> Path:
    """A language model's checkpoint (pretraining's) as transformers' causal-LM folder with its
    tokenizer, the end-of-text token its eos: where `generate` and pipelines stop, as pretraining's
    documents end."""
    from gpt_ft.eval.framing import framed_as_prompts
    from gpt_ft.eval.generation import framing_tokens, stop_tokens

    gpt = GPT.from_checkpoint(stored)
    tokenizer = saved_tokenizer(stored, gpt.config.vocab_size)
    model, eos = to_hf(gpt), stop_tokens(tokenizer, gpt.config)
    if eos:
        model.config.eos_token_id = model.generation_config.eos_token_id = eos[0] if len(eos) == 1 else eos
        model.generation_config.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        )
    model.generation_config.suppress_tokens = framing_tokens(tokenizer, gpt.config.vocab_size) or None
    tokenizer.model_max_length = gpt.config.n_positions  # the model's context, where pipelines cut prompts
    framed_as_prompts(tokenizer)  # ([CLS] a [SEP] where its own post-processor frames so)
    with written_whole(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        loads_as_written(tmp, tokenizer)
    return out


def export_gguf(stored: Checkpoint, out: Path, gguf_type: str = "f16") -> Path:
    """A language model's checkpoint as one GGUF file, by way of its transformers folder."""
    with tempfile.TemporaryDirectory() as scratch:
        return place_gguf(export_language_model(stored, Path(scratch) / "lm"), out, gguf_type)


def export_encoder(clf: Classifier, out: str | Path) -> Path:
    """Writes an embedding model as a sentence-transformers folder: the transformers base model and
    the framed tokenizer, the card's pooling (last-token: the extract token's state, or the text's
    last token's; or the mean of `[start] text`), the projection where the card has one (`Dense`),
    `Normalize`; the card's prompts in its config, the query's the default."""
    import_transformers_models()
    try:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    except ImportError:
        raise ValueError(
            "An embedding model exports as a sentence-transformers folder: pip install 'gpt_ft[sentence]'."
        ) from None
    from transformers import AutoModel

    lm, head, task = language_model(clf), clf.head, clf.task
    base = AutoModel.from_config(lm.config).eval()
    base.load_state_dict(getattr(lm, lm.base_model_prefix).state_dict())
    n_embd = clf.gpt.config.n_embd
    with written_whole(out := Path(out).expanduser()) as tmp:
        model_dir = tmp.parent / "model"  # (scratch: the encoder's save copies it)
        base.save_pretrained(model_dir)
        (framed := framed_tokenizer(clf)).save_pretrained(model_dir)
        loads_as_written(model_dir, framed)  # (the encoder's Transformer loads it)
        modules = [
            Transformer(str(model_dir), max_seq_length=clf.max_length),
            Pooling(n_embd, "mean" if task.pooling == "mean" else "lasttoken"),
        ]
        if head.projects:
            bias = head.bias is not None
            dense = Dense(n_embd, head.out_features, bias=bias, activation_function=torch.nn.Identity())
            dense.linear.load_state_dict(head.state_dict())
            modules.append(dense)
        modules.append(Normalize())
        prompts = {k: v for k, v in (("query", task.query_prompt), ("document", task.document_prompt)) if v}
        encoder = SentenceTransformer(
            modules=modules, prompts=prompts, default_prompt_name="query" if "query" in prompts else None
        )
        encoder.save(str(tmp))
        loads_as_written(tmp, framed)
    return out


def _label_config(clf: Classifier, config) -> None:
    """The labels' names, their count and the problem type, on a transformers config."""
    output, head = clf.task.output, clf.head
    names = output.served_labels()
    config.num_labels = head.out_features
    config.id2label = {i: str(name) for i, name in enumerate(names[: head.out_features])}
    config.label2id = {name: i for i, name in config.id2label.items()}
    config.problem_type = output.problem_type
    if head.out_features == 1:  # a reward, a relevance or a similarity score: CrossEncoder reads it raw
        config.sentence_transformers = {"activation_fn": "torch.nn.modules.linear.Identity"}
    threshold = getattr(head, "threshold", None)
    if output.problem_type == "multi_label_classification" and threshold is not None:
        # The card's threshold on the sigmoid of the raw outputs, as on the exported (divided by T) ones.
        logit, t = math.log(threshold / (1 - threshold)), clf.temperature
        config.threshold = float(threshold) if t == 1 else 1 / (1 + math.exp(-logit / t))  # 0.3 as written


def sequence_classifier(clf: Classifier):
    """The transformers `*ForSequenceClassification` with `clf`'s weights and its head folded in."""
    lm = language_model(clf)  # (its transformers model imported first: quietly, `to_hf`)
    from transformers import AutoModelForSequenceClassification

    config = lm.config
    _label_config(clf, config)
    if (score_range := getattr(clf.task, "score_range", None)) is not None:  # to clip to where served
        config.score_range = list(score_range)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    base = getattr(model, model.base_model_prefix)
    base.load_state_dict(getattr(lm, lm.base_model_prefix).state_dict())
    weight, bias = head_weights(clf)
    with torch.no_grad():
        model.score.weight.copy_(weight)
        if bias is None:  # a model without biases: its head has none either
            return model
        if clf.gpt.config.norm != "layernorm":  # a Llama-family model: RMSNorm, no bias to shift
            why = (  # a model of biases (attention_bias) trains a head with one too
                "its model has biases, so its head has one"
                if clf.gpt.config.bias
                else "heads of models without biases have none since gpt_ft 0.1: fine-tune again"
            )
            raise ValueError(
                f"This {config.model_type} classifier's head has a bias, which transformers' score layer "
                f"(no bias) and the final RMSNorm cannot carry: {why}; Classifier and `gpt-ft label` use it."
            )
        pre_ln = clf.gpt.config.pre_ln  # the final LayerNorm: GPT-NeoX's, GPT-2's; GPT-1's last
        final = getattr(base, "final_layer_norm", None) or (base.ln_f if pre_ln else base.h[-1].ln_2)
        shift = torch.linalg.pinv(weight.double()) @ bias.double()  # W δ = b
        if not torch.allclose(weight.double() @ shift, bias.double(), rtol=1e-6, atol=1e-6):
            raise ValueError(
                f"This classifier's head has {weight.shape[0]} outputs, more than the model's width "
                f"({weight.shape[1]}): transformers' score layer has no bias, and the final LayerNorm's "
                "cannot carry this one; Classifier and `gpt-ft label` use it."
            )
        final.bias.copy_((final.bias.double() + shift).float())
    return model


def token_classifier(clf: Classifier):
    """A process reward model as transformers' `*ForTokenClassification` (GPT-2 and the Llama
    families): logits [0, z] at every token, z gpt_ft's, so that at each step's separator (the
    extract token, `config.step_separator`) softmax(logits)[1] = σ(z), P(right so far), as TRL's and
    Qwen's PRMs are read; `config.threshold` is the one validation chose."""
    lm = language_model(clf)
    from transformers import AutoModelForTokenClassification

    config = lm.config
    config.num_labels, config.problem_type = 2, clf.task.output.problem_type
    config.id2label = dict(enumerate(clf.task.output.served_labels()))
    config.label2id = {name: i for i, name in config.id2label.items()}
    config.step_separator_token_id = clf.specials.extract
    config.step_separator = clf.tokenizer.convert_ids_to_tokens(clf.specials.extract)
    config.threshold = float(clf.head.threshold)
    try:
        model = AutoModelForTokenClassification.from_config(config).eval()
    except ValueError:
        raise ValueError(
            f"transformers has no token classifier of {config.model_type} models: use "
            "gpt_ft's Classifier or `gpt-ft label` for this process reward model."
        ) from None
    getattr(model, model.base_model_prefix).load_state_dict(getattr(lm, lm.base_model_prefix).state_dict())
    layer = model.score if hasattr(model, "score") else model.classifier
    weight, bias = head_weights(clf)
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[1] = weight[0]
        if layer.bias is not None:
            layer.bias.zero_()
            layer.bias[1] = bias[0] if bias is not None else 0.0
        elif bias is not None:
            raise ValueError(f"{type(model).__name__}'s score layer has no bias for this head's.")
    return model


def similarity_model(clf: Classifier):
    """GPT-1's similarity classifier (both orders, states added, then the head) as the model class
    of `modeling_similarity.py`, shipped in the folder: its `config.json` names it for
    `AutoModelForSequenceClassification` (`auto_map`), loaded with `trust_remote_code=True`."""
    lm = language_model(clf)
    from gpt_ft.eval import modeling_similarity

    config = lm.config
    _label_config(clf, config)
    weight, bias = head_weights(clf)
    config.delim_token_id = clf.specials.delim
    config.score_bias = bias is not None
    config.score_range = list(clf.task.score_range) if clf.task.score_range is not None else None
    cls = modeling_similarity.CLASSES[config.model_type]
    config.auto_map = {
        "AutoModelForSequenceClassification": f"{cls.__module__.rpartition('.')[2]}.{cls.__name__}"
    }
    model = cls(config).eval()
    model.model.load_state_dict(getattr(lm, lm.base_model_prefix).state_dict())
    with torch.no_grad():
        model.score.weight.copy_(weight)
        if bias is not None:
            model.score.bias.copy_(bias)
    return model


def double_heads_model(clf: Classifier):
    """GPT-1's or GPT-2's `*DoubleHeadsModel`: the language model and the choice head read at each
    choice's extract token (`mc_token_ids`), one score per choice (GPT-1 §3.3)."""
    lm = language_model(clf)
    from transformers import GPT2DoubleHeadsModel, OpenAIGPTDoubleHeadsModel

    config, output = lm.config, clf.task.output
    names = (  # the choices' names beside the head's one score per choice; ARC's rows name their own
        {"choice_labels": [str(output.label_name(i)) for i in range(output.choices)]}
        if output.names_field is None
        else {"choice_names_field": output.names_field}
    )
    config.update(dict(summary_type="cls_index", summary_use_proj=True, summary_proj_to_labels=True,
                       summary_activation=None, num_labels=1, **names))  # fmt: skip
    cls = GPT2DoubleHeadsModel if clf.gpt.config.pre_ln else OpenAIGPTDoubleHeadsModel  # GPT-2; GPT-1
    model = cls(config).eval()
    loaded = model.load_state_dict(lm.state_dict(), strict=False)
    assert all(k.startswith("multiple_choice_head.") for k in loaded.missing_keys), loaded
    weight, bias = head_weights(clf)
    with torch.no_grad():
        model.multiple_choice_head.summary.weight.copy_(weight)
        if bias is not None:
            model.multiple_choice_head.summary.bias.copy_(bias)
    model.tie_weights()
    return model
