"""Fixtures shared across the test folders: a trained tokenizer and a fine-tuned checkpoint, each
made once per session; the commands that run in the background (tests/background.py)."""

import gc
import inspect
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import lightning  # noqa: F401  (its log handler takes sys.stderr at import: the session's, not a test's capsys)
import pytest
import torch

from gpt_ft.data.tokenizer import train_tokenizer
from gpt_ft.weights import gguf_tokenizer
from tests.background import WORKERS, Background, start_template
from tests.helpers import PAIR_ROWS, ROOT, finetune_args, make_task

# What the imports above made lives as long as the session: the collector need not walk it again
# at every full collection (a tenth of a second each). What the tests leave alive (caches, compiled
# graphs, parsers) grows over the session too, and each full collection walks it all: one at most
# every 100 collections of the middle generation (Python's default: 10) saves some 5% of the
# session; the young generations still collect what a test leaves behind.
gc.freeze()
gc.set_threshold(*gc.get_threshold()[:2], 100)

CORPUS = """The quick brown fox jumps over the lazy dog. A man is playing a guitar.
It is a charming and often affecting journey. Weapons of mass destruction were not found.
She decides to bake a batch of brownies for the party. He is happy now. He joined a gang.
Is it true? Yes, it is. No, it is not. The cat sat on the mat. Two dogs run in a park.
"""


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE tokenizer (with the GPT-1 special tokens), trained once per session."""
    root = tmp_path_factory.mktemp("tokenizer")
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS * 20)
    out = root / "tok"
    train_tokenizer(inputs=[corpus], vocab_size=400, out_dir=out, show_progress=False)
    return str(out)


@pytest.fixture(scope="session")
def finetuned(tmp_path_factory, tokenizer_dir):
    """The single-text task of `make_task` fine-tuned in-process with `finetune_args` (3 epochs of 3
    batches, seed 3): root (its data), card, logs and the run's last.ckpt. Read it, never write it."""
    from gpt_ft.cli import main

    root = tmp_path_factory.mktemp("finetuned")
    card = make_task("single", root)
    logs = root / "logs"
    main(["fit", *finetune_args(card, tokenizer_dir, root, logs)])
    ckpt = logs / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return SimpleNamespace(root=root, card=card, logs=logs, ckpt=ckpt)


@pytest.fixture
def pairs_dir(tmp_path) -> Path:
    """PAIR_ROWS written as tmp_path/PAIRS/{train,dev,test}.tsv; returns tmp_path."""
    (tmp_path / "PAIRS").mkdir()
    for name, text in PAIR_ROWS.items():
        (tmp_path / "PAIRS" / name).write_text(text)
    return tmp_path


OWN_SESSION = ("tests/eval/test_suite.py", "tests/model/test_fused.py")
"""Modules that, when the whole suite runs, run as a pytest session of their own in the background
(tests/test_own_session.py), on the core the background commands leave idle for the in-process
tests' last minute; run alone or by their folder, in this session."""
INNER = "GPT_FT_TESTS_OWN_SESSION"  # set in that session


def whole_suite(config) -> bool:
    """Whether the session runs every test: no path given (or the repository's, or tests/), no -k,
    -m, --ignore or --deselect (which the session of their own would not see), nor --collect-only."""
    here, option = config.invocation_params.dir, config.option
    given = any((here / a.split("::")[0]).resolve() in (ROOT, ROOT / "tests") for a in config.args)
    narrowed = (option.keyword, option.markexpr, option.ignore, option.ignore_glob, option.deselect)
    return given and not any(narrowed) and not option.collectonly


def pytest_ignore_collect(collection_path, config):
    if os.environ.get(INNER) or not whole_suite(config):
        return None
    return True if collection_path.resolve() in {ROOT / m for m in OWN_SESSION} else None


def pytest_configure(config):
    # Converted GGUF tokenizers go to the session's own cache, never the user's (before the
    # background commands copy the environment).
    os.environ[gguf_tokenizer.CACHE] = tempfile.mkdtemp(prefix="gpt_ft-cache-")
    if not config.option.collectonly and not os.environ.get(INNER):  # (that session starts none)
        start_template()  # while the tests are collected
    config.addinivalue_line(
        "markers",
        "background(start=fn, first=False): the test checks the commands that fn(root, **fixtures) returns, "
        "run in processes of their own in the background from the start of the session (first: queued "
        "before the others; tests/background.py)",
    )


def pytest_unconfigure(config):
    shutil.rmtree(os.environ.pop(gguf_tokenizer.CACHE, ""), ignore_errors=True)  # (pytest's folders stay)


def pytest_collection_modifyitems(session, config, items):
    """The tests that wait on background commands run last, in their order: the others fill the wait."""
    items.sort(key=lambda item: item.get_closest_marker("background") is not None)  # stable


@pytest.fixture(scope="session", autouse=True)
def _background(request, tmp_path_factory):
    """Starts the background commands of every selected test, in test order, at the first test.
    The session's own tests compute on one thread, and so do the processes they start: the other
    core is the background's."""
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    jobs = Background()  # its commands' environment is the session's as it was, on one thread
    os.environ["OMP_NUM_THREADS"] = "1"
    for item in sorted(request.session.items, key=lambda item: not starts_first(item)):
        marker = item.get_closest_marker("background")
        if marker is None or marker.kwargs["start"] in jobs:
            continue
        start = marker.kwargs["start"]
        root = tmp_path_factory.mktemp(start.__name__)
        try:
            names = [name for name in inspect.signature(start).parameters if name != "root"]
            commands = start(root, **{name: request.getfixturevalue(name) for name in names})
        except Exception as exc:  # the marked test fails with it; the others go on
            jobs.fail(start, root, exc)
        else:
            jobs.submit(start, root, commands)
    request.config.stash[BACKGROUND] = jobs
    yield jobs
    jobs.close()
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp


def starts_first(item) -> bool:
    """A background job marked `first` (a long one) is queued before the others."""
    marker = item.get_closest_marker("background")
    return bool(marker and marker.kwargs.get("first"))


BACKGROUND = pytest.StashKey[Background]()


def pytest_terminal_summary(terminalreporter, config):
    """The background commands' wall time: where the session waits on them, they set its length."""
    jobs = config.stash.get(BACKGROUND, None)
    if jobs is None or not jobs.seconds:
        return
    seconds = sorted(jobs.seconds, reverse=True)
    total = sum(t for t, _ in seconds)
    shown = seconds if config.option.verbose > 0 else seconds[:5]  # -v: every command
    longest = ", ".join(f"{what} {t:.1f}s" for t, what in shown)
    terminalreporter.write_line(
        f"background: {len(seconds)} commands, {total:.1f}s in all ({WORKERS} at a time after the tests); "
        f"longest: {longest}"
    )
    for line in jobs.misread:
        terminalreporter.write_line(f"background: {line}")
    if jobs.waited_from is not None and jobs.ended is not None:
        tests, done = jobs.waited_from - jobs.started, jobs.ended - jobs.started
        terminalreporter.write_line(
            f"background: the in-process tests ended at {tests:.0f}s, the background at {done:.0f}s"
        )


@pytest.fixture
def background(request, _background):
    """This test's background commands, finished: `root` (the folder `start` was given) and `runs`
    (their `subprocess.CompletedProcess`es, in order)."""
    start = request.node.get_closest_marker("background").kwargs["start"]
    root, runs = _background.result(start)
    return SimpleNamespace(root=root, runs=runs)


@pytest.fixture
def exact_fp32():
    """Plain fp32 matmuls (no TF32) for a CUDA test's equality checks, the settings put back after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
