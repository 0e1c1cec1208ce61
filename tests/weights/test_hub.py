"""Hub ids (`ORG/NAME[@revision]`) wherever weights or a tokenizer are named, from a hub cache
folder built here (no network): the standard layout, `HF_HUB_OFFLINE=1`."""

from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from transformers import GPT2Config, GPT2LMHeadModel

from gpt_ft import GPT
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.weights import hub
from gpt_ft.weights.checkpoint import Checkpoint
from gpt_ft.weights.pretrained import weights_tokenizer
from tests.helpers import common_args, make_task

load_weights = GPT.from_pretrained

REVISION = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache: Path, repo: str, model, tokenizer) -> Path:
    """`repo` laid out in a hub cache as `snapshot_download` leaves it: models--ORG--NAME with
    snapshots/REVISION and refs/main."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / REVISION
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, tokenizer_dir, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = load_tokenizer(tokenizer_dir, add_specials=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2)
    )
    cache_model(cache, "tiny-org/tiny-gpt2", model, tokenizer)
    return model.eval()


def test_hub_ids_are_told_from_local_paths(tmp_path):
    assert (
        hub.is_hub_id("openai-community/openai-gpt") and hub.is_hub_id("gpt2") and hub.is_hub_id("a/b@v1.0")
    )
    assert not hub.is_hub_id(str(tmp_path)) and not hub.is_hub_id("./model") and not hub.is_hub_id("x.ckpt")
    assert not hub.is_hub_id("a/b/c")


def test_weights_and_tokenizer_from_a_cached_snapshot(offline_cache):
    gpt = GPT.from_pretrained("tiny-org/tiny-gpt2").eval()
    ids = torch.randint(0, 100, (2, 10))
    torch.testing.assert_close(gpt.lm_logits(gpt(ids)), offline_cache(ids).logits, rtol=0, atol=1e-4)
    assert load_weights(f"tiny-org/tiny-gpt2@{REVISION}").config.n_embd == 32
    assert Path(weights_tokenizer("tiny-org/tiny-gpt2")).name == REVISION
    assert len(load_tokenizer("tiny-org/tiny-gpt2", add_specials=False)) == offline_cache.config.vocab_size


def test_an_uncached_name_offline_is_one_sentence(offline_cache, tmp_path, tokenizer_dir, capsys):
    with pytest.raises(
        FileNotFoundError, match=r"^tiny-org/absent is not a local path and not in the hub cache"
    ):
        load_weights("tiny-org/absent")
    card = make_task("single", tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--model.init_from=tiny-org/absent"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"gpt-ft: error: tiny-org/absent is not a local path and not in the hub cache {tmp_path / 'hub'}, "
        "and cannot be downloaded (HF_HUB_OFFLINE is set): download it where the hub answers "
        "(`hf download tiny-org/absent`) into this cache, or give a local folder."
    )


def test_fine_tune_from_a_hub_id_offline(offline_cache, tmp_path, capsys):
    card = make_task("pair", tmp_path)
    args = [
        a
        for a in common_args(card, "tiny-org/tiny-gpt2", tmp_path)
        if not a.startswith(("--model.preset", "--model.overrides"))
    ]
    main(
        [
            "fit",
            "--config=configs/finetune/gpt1.yaml",
            *args,
            "--model.init_from=tiny-org/tiny-gpt2",
            "--trainer.max_epochs=1",
        ]
    )
    assert "validation/accuracy" in capsys.readouterr().out
    assert list((tmp_path / "runs").rglob("last.ckpt"))


def test_lora_adapters_of_a_hub_id_record_the_commit_their_base_came_from(offline_cache, tmp_path, capsys):
    """The repository's newest commit moves: the checkpoint names the one its base weights were read
    from, and `validate` reads that commit's (from the cache, offline)."""
    card = make_task("pair", tmp_path)
    args = [a for a in common_args(card, "tiny-org/tiny-gpt2", tmp_path)
            if not a.startswith(("--model.preset", "--model.overrides"))]  # fmt: skip
    main(["fit", "--config=configs/finetune/gpt1.yaml", *args, "--model.init_from=tiny-org/tiny-gpt2",
          "--trainer.max_epochs=1", "--model.lora.rank=2"])  # fmt: skip
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    assert Checkpoint.read(ckpt).adapters.base == f"tiny-org/tiny-gpt2@{REVISION}"
    capsys.readouterr()
    main(["validate", f"--ckpt_path={ckpt}", "--trainer.enable_progress_bar=false",
          f"--trainer.logger.init_args.save_dir={tmp_path / 'scored'}"])  # fmt: skip
    assert "validation/accuracy" in capsys.readouterr().out


def test_a_hub_that_does_not_answer_is_one_line(monkeypatch):
    """The download's error (several lines, from the HTTP client) is cut to its first line."""

    def no_network(*args, **kwargs):
        raise OSError("Got: ConnectError: [Errno -2] Name or service not known\n\nAn error happened.")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(FileNotFoundError) as error:
        hub.snapshot("tiny-org/nowhere")
    assert "\n" not in str(error.value)
    assert str(error.value).endswith(
        "(the hub did not answer: ConnectError: [Errno -2] Name or service not known): download it "
        "where the hub answers (`hf download tiny-org/nowhere`) into this cache, or give a local folder."
    )


def test_a_cached_commit_is_read_without_asking_the_hub(offline_cache, monkeypatch):
    """A commit cannot change: cached, it is read from the cache even online (each request to a hub
    that does not answer was retried for about 20 s); a branch still asks."""
    import huggingface_hub

    real, asked = huggingface_hub.snapshot_download, []

    def no_network(*args, local_files_only=False, **kwargs):
        if not local_files_only:
            asked.append(args)
            raise OSError("Got: ConnectError: [Errno -2] Name or service not known")
        return real(*args, local_files_only=True, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert hub.snapshot(f"tiny-org/tiny-gpt2@{REVISION}").name == REVISION and asked == []
    with pytest.raises(FileNotFoundError, match="the hub did not answer"):
        hub.snapshot("tiny-org/tiny-gpt2@main")
    assert len(asked) == 1
    partial = "f" * 40  # a commit of which the cache holds the config alone: the rest is asked for
    (
        offline_cache_dir := Path(constants.HF_HUB_CACHE)
        / "models--tiny-org--tiny-gpt2"
        / "snapshots"
        / partial
    ).mkdir()
    (offline_cache_dir / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"`hf download tiny-org/tiny-gpt2 --revision {partial}`"):
        hub.snapshot(f"tiny-org/tiny-gpt2@{partial}")
    assert len(asked) == 2
    from gpt_ft.data.tokenizer import _looks_like_local_path

    for name in ("org/name@refs/pr/1", "gpt2@main"):  # the tokenizer's view of a hub id is the weights'
        assert hub.is_hub_id(name) and not _looks_like_local_path(name)
    snapshots = Path(constants.HF_HUB_CACHE) / "models--tiny-org--tiny-gpt2" / "snapshots"
    index = "model.safetensors.index.json"
    for commit, files in [("a" * 40, {index: '{"weight_map": {"w": "model-1.safetensors"}}'}),
                          ("b" * 40, {index: "{not json"}),
                          ("c" * 40, {"model-00001-of-00002.safetensors": ""})]:  # fmt: skip
        (snapshots / commit).mkdir()
        for name, text in {"config.json": "{}", "tokenizer.json": "{}", **files}.items():
            (snapshots / commit / name).write_text(text)
        with pytest.raises(FileNotFoundError, match="the hub did not answer"):  # not whole: asked for
            hub.snapshot(f"tiny-org/tiny-gpt2@{commit}")
    assert len(asked) == 5
    assert len(load_tokenizer(f"tiny-org/tiny-gpt2@{REVISION}", add_specials=False)) == 400  # it was refused


def test_only_the_files_read_are_fetched():
    """A Mistral repository holds its weights twice (model-*.safetensors and consolidated.safetensors,
    14 GB more for 7B); `hf.read` reads the first."""
    from huggingface_hub.utils import filter_repo_objects

    files = ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
             "consolidated.safetensors", "tokenizer.json",
             "tokenizer.model", "pytorch_model.bin"]  # fmt: skip
    assert list(filter_repo_objects(files, allow_patterns=hub.WANTED)) == [
        "config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer.model"]  # fmt: skip


def test_a_tokenizer_alone_fetches_no_weights(monkeypatch, tokenizer_dir):
    """`--data.tokenizer ORG/NAME` of a 7B repository read a few JSON files after fetching gigabytes."""
    import huggingface_hub

    asked = []

    def snapshot_download(repo, allow_patterns, **kwargs):
        asked.append(allow_patterns)
        return str(tokenizer_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert len(load_tokenizer("big-org/big-model", add_specials=False)) == 400
    assert asked == [hub.TOKENIZER_WANTED] and not any("safetensors" in p or ".bin" in p for p in asked[0])
    hub.snapshot("big-org/big-model")  # the weights: safetensors, then .bin where there are none
    assert asked[1:] == [hub.WANTED, hub.WANTED + hub.BIN_WEIGHTS]


def test_a_gated_or_missing_repository_says_which(monkeypatch):
    """A gated repository is a RepositoryNotFoundError to huggingface_hub: it was reported missing."""
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    answer = SimpleNamespace(headers={}, request=None)
    for error, said in [
        (GatedRepoError, "gated-org/model is a gated repository on the hub: accept its terms on its page, "
                         "then log in (`hf auth login`, or set HF_TOKEN) with the account granted access."),
        (RepositoryNotFoundError, "gated-org/model@v2 is not a local path, and the hub has no such "
                                  "repository, or none this login may read (a private one needs `hf auth "
                                  "login`)."),
    ]:  # fmt: skip

        def refused(*args, error=error, **kwargs):
            raise error("401 Client Error", response=answer)

        monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        with pytest.raises(FileNotFoundError) as raised:
            load_tokenizer("gated-org/model" + "@v2" * (error is RepositoryNotFoundError))
        assert str(raised.value) == said
