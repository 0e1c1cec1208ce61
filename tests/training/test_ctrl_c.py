"""Ctrl-C (SIGINT) during `gpt-ft fit` stops like SIGTERM: the optimizer step under way finishes,
`last.ckpt` is saved, the resume command is printed and the exit code is 130; `--ckpt_path last`
then ends with the uninterrupted run's weights. A second Ctrl-C stops at once."""

from __future__ import annotations

import os
import signal

import pytest

from gpt_ft.cli import main
from tests.background import gpt_ft
from tests.helpers import ROOT, finetune_args, make_task
from tests.training.test_checkpointing import assert_same_weights, interrupt, last_state


def start_sigint(root, tokenizer_dir, finetuned):
    """`finetuned`'s run (the uninterrupted one) into root/cut, sent SIGINT after batch 5 (epoch 1,
    batch 2 of 3)."""
    args = finetune_args(finetuned.card, tokenizer_dir, finetuned.root, root / "cut")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return [gpt_ft("fit", *args, *interrupt(5, signal.SIGINT), env=env)]


@pytest.mark.background(start=start_sigint)
def test_ctrl_c_saves_the_step_says_how_to_resume_and_resumes_exactly(background, tokenizer_dir, finetuned):
    (stopped,) = background.runs
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    cut = background.root / "cut"
    ckpt = cut / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert (
        f"SIGINT: saved step 5 to {ckpt}; resume with the same `gpt-ft fit` command and --ckpt_path last"
        in (stopped.stdout)
    )
    assert "press Ctrl-C again to stop at once" in stopped.stderr
    assert stopped.stderr.rstrip().endswith("gpt-ft: stopped by Ctrl-C (SIGINT)")
    assert "Traceback" not in stopped.stderr
    assert last_state(cut, 0)["global_step"] == 5
    main(["fit", *finetune_args(finetuned.card, tokenizer_dir, finetuned.root, cut), "--ckpt_path=last"])
    assert_same_weights(last_state(finetuned.logs, 0), last_state(cut, 1))


def test_a_second_ctrl_c_stops_at_once_and_gives_the_handler_back(tmp_path, tokenizer_dir, capfd):
    card = make_task("single", tmp_path)
    # Python's handler, as a terminal starts a run (one started under a script's `&` ignores Ctrl-C)
    started = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.getsignal(signal.SIGINT)
    # Two presses after batch 4 (the first of epoch 1), before its step's checkpoint is written.
    twice = interrupt(4, signal.SIGINT) * 2
    try:
        with pytest.raises(SystemExit) as stopped:
            main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), *twice])
    finally:
        handler = signal.signal(signal.SIGINT, started)
    assert stopped.value.code == 128 + signal.SIGINT
    err = capfd.readouterr().err
    assert "press Ctrl-C again to stop at once" in err  # the first press was gpt_ft's, not Python's
    assert err.rstrip().endswith("gpt-ft: stopped by Ctrl-C (SIGINT)") and "Traceback" not in err
    assert last_state(tmp_path / "logs", 0)["global_step"] == 3  # the epoch-0 validation's, not step 4's
    assert handler is before


def test_sigterm_is_the_stop_taken_whichever_signal_came_first():
    """A Ctrl-C, then a pre-emption's SIGTERM: the run stops as SIGTERM asks (exit 143), as ranks
    that saw the two apart agree (the first signal was kept: "stopped by Ctrl-C", 130)."""
    import os
    import signal
    from types import SimpleNamespace

    from gpt_ft.training.stop_signals import StopSignals

    stops = StopSignals()
    stops.install(SimpleNamespace(is_global_zero=False, world_size=1))
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.agreed() == signal.SIGTERM
    finally:
        stops.restore()


def test_a_signal_ignored_where_the_run_started_stays_ignored():
    """A run started in the background by a script (`gpt-ft fit ... &`) inherits SIGINT ignored: it
    ignored Ctrl-C while it set up, then stopped at one once training began (its handler put over
    the SIG_IGN); now it ignores it throughout, as Python does, and SIGTERM still stops it."""
    import signal
    from types import SimpleNamespace

    from gpt_ft.training.stop_signals import StopSignals

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    stops = StopSignals()
    try:
        stops.install(SimpleNamespace(is_global_zero=False, world_size=1))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == stops._on_signal
    finally:
        stops.restore()
        signal.signal(signal.SIGINT, before)
