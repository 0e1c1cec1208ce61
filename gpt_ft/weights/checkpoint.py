"""The checkpoint format, in one place: its keys, and a typed view that reads and writes them.

A gpt_ft checkpoint is one file: a dict saved with `torch.save` and read with `torch.load(weights_only=True)`
(tensors and plain values only: reading it never runs code). A training run's checkpoint is Lightning's
dict with gpt_ft's entries added; the model's entries alone are one too (loaded with no run's arguments).

| key                | `Checkpoint` attribute | what it holds                                            |
|--------------------|------------------------|----------------------------------------------------------|
| "gpt_config"       | `gpt_config`           | the `GPTConfig`'s fields, as plain values                |
| "state_dict"       | `state`                | tensors: the GPT's under "gpt.", the task head's "head." |
| "lora"             | `adapters`             | a LoRA run's base weights and settings (see below)       |
| "tokenizer"        | `tokenizer`            | the tokenizer's folder, relative to the file's           |
| "data_config"      | `data`                 | the run's data section, its task card included           |
| "hyper_parameters" | `hyper_parameters`     | the model's arguments (Lightning's)                      |
| "temperature"      | `temperature`          | `gpt-ft calibrate`'s T (absent: 1)                       |
| "class_weights"    | `class_weights`        | the task loss's class weights, when the run set them     |
| "gpt_ft"           | `provenance`           | the toolkit's version and commit that wrote it           |

With "lora", "state_dict" holds only the GPT's trained tensors (LoRA's adapters and the new
tokens' rows): they load onto the weights named by its `base` (any name `GPT.from_pretrained`
takes) and are merged. Every other module asks this one for an entry; none spells a key.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pickle
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ft.errors import FileProblem, absent, writing
from gpt_ft.weights.state_checks import checked_temperature

GPT_CONFIG = "gpt_config"
STATE = "state_dict"
ADAPTERS = "lora"
TOKENIZER = "tokenizer"
DATA = "data_config"
HYPER_PARAMETERS = "hyper_parameters"
TEMPERATURE = "temperature"
CLASS_WEIGHTS = "class_weights"
PROVENANCE = "gpt_ft"
GPT_PREFIX = "gpt."
"""The GPT's tensors in "state_dict": the training module's attribute `gpt`."""

UNREADABLE = "{path} is not a readable checkpoint: the file is truncated, corrupt or of another kind."
UNSAFE = (
    "{path} holds objects other than tensors and plain values; checkpoints are read with "
    "torch.load(weights_only=True), which never runs code from a file."
)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short digest of a model's weights as loaded: each tensor's name, shape and 64 of its values,
    evenly spaced, as float32. Weights changed since (another fine-tune put in their place) differ.
    (The positions are float32's, as recorded fingerprints have them: past 2**24 values its last
    position may round up to the tensor's size, kept at its last value.)"""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        at = torch.linspace(0, max(flat.numel() - 1, 0), min(64, flat.numel())).long()
        picked = flat[at.clamp_(max=max(flat.numel() - 1, 0))]
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(picked.float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class Adapters:
    """A LoRA checkpoint's "lora" entry: the weights its tensors adapt (`base`) and their
    `weights_fingerprint` as loaded then (None in checkpoints older than it), the first token row
    they train (`new_tokens_from`) and the adapters' settings (`gpt_ft.model.lora.LoRA`'s fields)."""

    base: str
    new_tokens_from: int
    settings: dict[str, Any]
    fingerprint: str | None = None

    def entry(self) -> dict[str, Any]:
        fingerprint = {"base_fingerprint": self.fingerprint} if self.fingerprint else {}
        return {"base": self.base, "new_tokens_from": self.new_tokens_from, **fingerprint, **self.settings}

    @classmethod
    def of(cls, lora, *, base: str, new_tokens_from: int, fingerprint: str | None = None) -> Adapters:
        """The entry of `lora` (a `LoRA`) adapting `base`."""
        return cls(base, new_tokens_from, asdict(lora), fingerprint)

    def check_base(self, now: str, where: str, loaded: str | None = None,
                   remedy: str = "give them with --model.init_from") -> None:  # fmt: skip
        """The base weights loaded now (`now`: their fingerprint; from `loaded`, default the
        recorded base) are those the adapters were trained on, where the checkpoint records which;
        `remedy`: how the command at hand takes those."""
        if self.fingerprint and now != self.fingerprint:
            trained = "" if loaded in (None, self.base) else f" (trained on {self.base}'s)"
            raise FileProblem(
                f"{where} holds LoRA adapters of other base weights than {loaded or self.base} holds now"
                f"{trained} (fingerprint {now}, trained on {self.fingerprint}): the weights they were "
                f"trained on are needed ({remedy}), or a checkpoint saved with --model.lora.checkpoint "
                "merged."
            )


LOAD_FAULTS = (RuntimeError, EOFError, KeyError, ValueError, OSError, IndexError, TypeError, struct.error)
"""What reading a file that is no checkpoint raises (a text read as a pickle: what its bytes ask)."""


def safe_load(path: str | Path, load=None) -> dict[str, Any]:
    """A checkpoint's dict read with `torch.load(weights_only=True)`, on the CPU (or with `load(path)`),
    its tensors mapped from the file, read where used (a run's configuration without its weights).

    A file that would run code, or that is truncated, empty or not a checkpoint at all, is one
    sentence naming it.
    """
    path = Path(path).expanduser()  # `~/runs/last.ckpt`, as the shell would read it unquoted
    if path.exists() and not path.is_dir() and not path.is_file():  # a pipe waits for a writer: forever
        raise FileProblem(f"{path} is not a regular file (a pipe, a device): give a checkpoint file.")
    try:
        mmap = load is None and _starts(path) == b"PK"
        entries = load(path) if load is not None else torch.load(path, "cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # weights-only refused an import in what torch writes (a zip, pickle 2+), not a text that starts "c"
        unsafe = "GLOBAL" in str(exc) and _starts(path) in (b"PK", b"\x80")
        raise FileProblem(UNSAFE.format(path=path) if unsafe else _not_a_checkpoint(path)) from None
    except LOAD_FAULTS as exc:
        if isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(f"Checkpoint {path} {absent(path)}.") from None
        if isinstance(exc, OSError) and not path.is_dir() or "allocat" in str(exc):  # this process's read
            code = getattr(exc, "errno", None) or (errno.ENOMEM if "allocat" in str(exc) else errno.EIO)
            raise OSError(code, getattr(exc, "strerror", None) or str(exc), str(path))  # (a number: str())
        raise FileProblem(_not_a_checkpoint(path)) from None
    if not isinstance(entries, dict) or STATE not in entries:  # a state dict, a tensor
        kind = "a safetensors file" if Path(path).suffix == ".safetensors" else "a torch file"
        raise FileProblem(
            f"{path} is {kind} but not a checkpoint of `gpt-ft fit` (it has no 'state_dict' entry); "
            "a model's weights are started from as a transformers folder or a GGUF file (--model.init_from)."
        )
    return entries


def _starts(path: str | Path) -> bytes:
    """A file's start as torch's formats begin: b"PK" (a zip archive), b"\\x80" (a pickle's protocol)."""
    head = b""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        head = f.read(2)
    return head if head == b"PK" else head[:1]


def _not_a_checkpoint(path: Path) -> str:
    """Why `path` cannot be read as a checkpoint, with what to do where it holds weights of another kind."""
    weights = None
    if (path / "config.json").is_file():
        weights = "a transformers model folder"
    elif (path / "meta.pt").is_file():  # FSDP's sharded checkpoint: `fit` resumes it on the same GPUs
        return (
            f"{path} is a sharded checkpoint: every command reads it made into one file (python -m "
            f"lightning.pytorch.utilities.consolidate_checkpoint {path} --output_file FILE)."
        )
    elif path.is_dir():
        return f"{path} is a folder: give a checkpoint file in it (last.ckpt)."
    else:
        with contextlib.suppress(OSError), open(path, "rb") as f:
            weights = "a GGUF file" if f.read(4) == b"GGUF" else None
    if weights is None:
        return UNREADABLE.format(path=path)
    return (
        f"{path} is {weights} of pretrained weights, not a checkpoint of `gpt-ft fit`: start a run "
        f"from it with --model.init_from {path}."
    )


def save_file(entries: dict[str, Any], path: str | Path) -> None:
    """`entries` written to a temporary file in the same folder, synced, then renamed into place: a
    crash while saving never leaves a truncated file where the last good one was. A failed write
    (no space left, permission denied) is one sentence, the previous file kept."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                _save(entries, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def _save(entries: dict[str, Any], f) -> None:
    """torch.save, whose zip writer may report a failed write (a full disk), or a Ctrl-C or SIGTERM
    mid-write, as a RuntimeError about its stream position: as the OSError or interrupt it is."""
    try:
        torch.save(entries, f)
    except RuntimeError as exc:
        if "inline_container" not in str(exc) and "PytorchStreamWriter" not in str(exc):
            raise
        cause = exc.__context__ if isinstance(exc.__context__, (OSError, KeyboardInterrupt)) else None
        raise cause or OSError(errno.EIO, "the checkpoint writer failed; is the disk full?") from exc


class Checkpoint:
    """A typed view of a checkpoint's dict: each entry read and written by name.

    `Checkpoint.read(path)` reads a file; `Checkpoint(entries)` views a dict being written (the one
    Lightning hands to `on_save_checkpoint`), so that writing an attribute writes the entry.
    """

    def __init__(self, entries: dict[str, Any], path: str | Path | None = None) -> None:
        self.entries = entries
        self.path = Path(path) if path is not None else None

    @classmethod
    def read(cls, path: str | Path) -> Checkpoint:
        """The checkpoint file at `path` (see `safe_load` for what is refused)."""
        return cls(safe_load(path), Path(path).expanduser())

    def save(self, path: str | Path) -> None:
        """Written atomically to `path` (`save_file`)."""
        save_file(self.entries, path)

    @property
    def where(self) -> str:
        """How messages name this checkpoint."""
        return str(self.path) if self.path is not None else "The checkpoint"

    # ---- the model ----

    @property
    def gpt_config(self) -> dict[str, Any] | None:
        """The GPT's config fields; None for a file that gpt_ft did not write. One this version does
        not know (a newer one's) is refused: the model built without it would be another."""
        from gpt_ft.model.config import check_known_fields

        fields = self.entries.get(GPT_CONFIG)
        return fields and check_known_fields(fields, self.where, self.provenance.get("version"))

    @gpt_config.setter
    def gpt_config(self, fields: dict[str, Any]) -> None:
        self.entries[GPT_CONFIG] = dict(fields)

    @property
    def is_gpt_ft(self) -> bool:
        return GPT_CONFIG in self.entries

    def require_gpt_config(self) -> dict[str, Any]:
        """The GPT's config fields, or one sentence saying the file is not a gpt_ft checkpoint."""
        if self.gpt_config is None:
            raise FileProblem(
                f"{self.where} is not a gpt_ft checkpoint: it records no model config ({GPT_CONFIG})."
            )
        return self.gpt_config

    @property
    def state(self) -> dict[str, Any]:
        """Every tensor, under the training module's names (`gpt.…`, `head.…`)."""
        return self.entries.get(STATE, {})

    @state.setter
    def state(self, tensors: dict[str, Any]) -> None:
        self.entries[STATE] = tensors

    def submodule_state(self, name: str) -> dict[str, Any]:
        """The tensors of the training module's submodule `name` (gpt, head), that prefix dropped."""
        prefix = name + "."
        return {k.removeprefix(prefix): v for k, v in self.state.items() if k.startswith(prefix)}

    @property
    def gpt_state(self) -> dict[str, Any]:
        """The GPT's tensors, under their names in `GPT.state_dict()`."""
        return self.submodule_state(GPT_PREFIX.rstrip("."))

    def check_adapters_whole(self, gpt, where: str | None = None) -> None:
        """Every tensor `gpt` (with its adapters added) trains is in the checkpoint: adapters loaded
        in part would run beside freshly started ones without a word."""
        missing = sorted({n for n, p in gpt.named_parameters() if p.requires_grad} - set(self.gpt_state))
        if missing:
            raise FileProblem(
                f"{where or self.where} lacks LoRA weights {missing[:3]}: it is not a complete LoRA "
                "checkpoint."
            )

    @property
    def adapters(self) -> Adapters | None:
        """A LoRA checkpoint's base weights and settings; None for a whole model."""
        entry = self.entries.get(ADAPTERS)
        if entry is None:
            return None
        settings = {
            k: v for k, v in entry.items() if k not in ("base", "new_tokens_from", "base_fingerprint")
        }
        return Adapters(entry["base"], entry["new_tokens_from"], settings, entry.get("base_fingerprint"))

    @adapters.setter
    def adapters(self, adapters: Adapters | None) -> None:
        if adapters is None:
            self.entries.pop(ADAPTERS, None)
        else:
            self.entries[ADAPTERS] = adapters.entry()

    # ---- what a run adds ----

    @property
    def tokenizer(self) -> Path | None:
        """The tokenizer's folder (saved beside the file, a link's target); None when it records none."""
        recorded = self.entries.get(TOKENIZER)
        if not recorded:
            return None
        return self.path.resolve().parent / recorded if self.path is not None else Path(recorded)

    def saved_tokenizer(self, instead: str = "") -> Path | None:
        """`tokenizer`, there: a file copied without the folder beside it is one sentence (`instead`
        may add what else to do), not a tokenizer sought under the folder's name on the Hub."""
        folder = self.tokenizer
        if folder is not None and not folder.is_dir():
            raise FileProblem(
                f"{self.where}: its tokenizer, saved beside it by gpt-ft fit, is not there "
                f"({folder.absolute()}): copy the checkpoint's {self.entries[TOKENIZER]}/ folder along "
                f"with it{instead}."
            )
        return folder

    @tokenizer.setter
    def tokenizer(self, folder: str | None) -> None:
        """`folder`: a name relative to the checkpoint file's folder."""
        self.entries[TOKENIZER] = folder

    @property
    def data(self) -> dict[str, Any] | None:
        """The run's data section (`class_path` and `init_args`, the task card among them)."""
        return self.entries.get(DATA) or None

    @data.setter
    def data(self, section: dict[str, Any] | None) -> None:
        self.entries[DATA] = section

    @property
    def data_args(self) -> dict[str, Any]:
        """The data section's arguments (empty when none is recorded)."""
        return (self.data or {}).get("init_args", {})

    @property
    def task_card(self) -> Any:
        """The task card the run trained on (a card value), or None."""
        return self.data_args.get("task")

    def require_task_card(self) -> Any:
        """The task card the run trained on, or one sentence saying why the file records none."""
        if self.is_gpt_ft and self.task_card:
            return self.task_card
        if not self.is_gpt_ft or not any(key.startswith("head.") for key in self.state):
            raise FileProblem(f"{self.where} is not a fine-tuned gpt_ft checkpoint: it records no task card.")
        raise FileProblem(
            f"{self.where} holds a task head but records no task card: it was saved outside `gpt-ft fit` "
            "(a plain lightning.Trainer), which records the card and the tokenizer; fine-tune with "
            "`gpt-ft fit`, or build gpt_ft.Classifier from the model, head, task and tokenizer in Python."
        )

    @property
    def hyper_parameters(self) -> dict[str, Any]:
        """The training module's arguments as Lightning saved them."""
        return self.entries.setdefault(HYPER_PARAMETERS, {})

    @property
    def temperature(self) -> float:
        """`gpt-ft calibrate`'s temperature, a positive number: divides the head's outputs first."""
        return checked_temperature(self.entries.get(TEMPERATURE, 1.0), self.where)

    @temperature.setter
    def temperature(self, value: float) -> None:
        if value == 1.0:
            self.entries.pop(TEMPERATURE, None)
        else:
            self.entries[TEMPERATURE] = float(value)

    @property
    def class_weights(self) -> list[float] | None:
        return self.entries.get(CLASS_WEIGHTS)

    @class_weights.setter
    def class_weights(self, weights: list[float] | None) -> None:
        if weights is None:
            self.entries.pop(CLASS_WEIGHTS, None)
        else:
            self.entries[CLASS_WEIGHTS] = list(weights)

    @property
    def provenance(self) -> dict[str, Any]:
        """The toolkit's `version` and `commit` that wrote the file (empty when unrecorded)."""
        return self.entries.get(PROVENANCE, {})

    @provenance.setter
    def provenance(self, value: dict[str, Any]) -> None:
        self.entries[PROVENANCE] = value
