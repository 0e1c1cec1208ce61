"""Weights and tokenizers named by a Hugging Face Hub id, `ORG/NAME` or `ORG/NAME@REVISION`.

Only the files a model or tokenizer needs are fetched (its config, safetensors weights, or the
`.bin` ones when a repository has no safetensors, and the tokenizer files; for a tokenizer alone,
no weights), into the standard hub cache (`HF_HUB_CACHE`, by default ~/.cache/huggingface/hub).
With `HF_HUB_OFFLINE=1` a cached snapshot is used and nothing is asked of the network.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# configs, weights (those `hf.read` reads: not Mistral's second copy, consolidated.safetensors), vocabularies
TOKENIZER_WANTED = ["*.json", "*.txt", "*.model", "*.tiktoken"]
WANTED = TOKENIZER_WANTED[:1] + ["model*.safetensors"] + TOKENIZER_WANTED[1:]
BIN_WEIGHTS = ["pytorch_model*.bin"]


def is_hub_id(name: str | os.PathLike) -> bool:
    """Whether `name` can name a hub repository: not an existing local path, and `ORG/NAME` (or a
    legacy `NAME`) with an optional `@revision`."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    text = os.fspath(name)
    if (
        Path(text).expanduser().exists()
        or text.startswith((".", "~", "/"))
        or text.endswith((".ckpt", ".gguf"))
    ):
        return False
    try:
        validate_repo_id(text.partition("@")[0])
    except HFValidationError:
        return False
    return True


def snapshot(name: str, weights: bool = True) -> Path:
    """The local folder holding hub repository `name`'s model and tokenizer files (without `weights`,
    its tokenizer's and configs alone), fetched if need be.

    Raises:
        FileNotFoundError: in one sentence, when the name is neither cached nor reachable.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, _, revision = name.partition("@")
    # the cache alone: offline (huggingface_hub 1.x would ask for a commit's files), or for a commit
    # the cache holds (it never changes; without a network, each request was retried for 20 s)
    offline = constants.HF_HUB_OFFLINE or (
        re.fullmatch(r"[0-9a-f]{40}", revision) is not None and _whole_in_cache(repo, revision, weights)
    )
    wanted = WANTED if weights else TOKENIZER_WANTED
    try:
        folder = Path(
            snapshot_download(
                repo, revision=revision or None, allow_patterns=wanted, local_files_only=offline
            )
        )
        if weights and not any(folder.glob("model*.safetensors")) and not offline:
            folder = Path(
                snapshot_download(repo, revision=revision or None, allow_patterns=WANTED + BIN_WEIGHTS)
            )
    except GatedRepoError:  # a RepositoryNotFoundError to huggingface_hub
        raise FileNotFoundError(
            f"{repo} is a gated repository on the hub: accept its terms on its page, then log in "
            "(`hf auth login`, or set HF_TOKEN) with the account granted access."
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        what = "revision" if isinstance(exc, RevisionNotFoundError) else "repository"
        private = ", or none this login may read (a private one needs `hf auth login`)" * (
            what == "repository"
        )
        raise FileNotFoundError(
            f"{name} is not a local path, and the hub has no such {what}{private}."
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        said = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        said = said.removeprefix("Got: ")  # httpx's wording, before the error's own
        why = "HF_HUB_OFFLINE is set" if offline else f"the hub did not answer: {said.rstrip('.')}"
        raise FileNotFoundError(
            f"{name} is not a local path and not in the hub cache {constants.HF_HUB_CACHE}, and cannot be "
            f"downloaded ({why}): download it where the hub answers (`hf download {repo}"
            f"{f' --revision {revision}' if revision else ''}`) into this cache, or give a local folder."
        ) from None
    return folder


def pinned(name: str) -> str:
    """Hub id `name` with the commit of the snapshot `snapshot` read for it (`ORG/NAME@COMMIT`), so
    that what names it later reads the same files; `name` as it is where it is no hub id, names a
    revision, or the cache holds none."""
    from huggingface_hub import try_to_load_from_cache

    found = None if "@" in name or not is_hub_id(name) else try_to_load_from_cache(name, "config.json")
    return f"{name}@{Path(found).parent.name}" if isinstance(found, str) else name


def _whole_in_cache(repo: str, commit: str, weights: bool = True) -> bool:
    """Whether the cache holds `commit` of `repo` as a download leaves it: its config, a vocabulary,
    and (if `weights`) its weights (every shard its index lists, the safetensors index first): nothing
    to ask."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo, "config.json", revision=commit)
    if not isinstance(config, str):  # not cached, or cached as missing
        return False
    folder = Path(config).parent
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return False
    if not weights:
        return True
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            try:
                shards = set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values())
            except (ValueError, KeyError, TypeError, AttributeError):  # a damaged index: fetched again
                return False
            return all((folder / shard).is_file() for shard in shards)
    return (folder / "model.safetensors").is_file() or (folder / "pytorch_model.bin").is_file()


def local(name: str | os.PathLike) -> Path:
    """A local path as given, or the snapshot folder of a hub id."""
    return snapshot(os.fspath(name)) if is_hub_id(name) else Path(name).expanduser()
