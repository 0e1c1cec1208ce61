"""SIGTERM (a cluster's pre-emption) and Ctrl-C (SIGINT) while a run trains, noted by handlers that
do nothing else, and agreed on by every rank where all of them are (`StopSignals.agreed`).

Lightning's own SIGTERM handler broadcasts inside the handler. A signal runs its handler between two
Python operations of whatever the process is doing, so one rank's broadcast could meet another
rank's collective of the step (the loss's mean, a checkpoint's gathered states) and both waited
forever, with no checkpoint saved. `SaveLast` installs these handlers in its place while training
runs and asks `agreed` at each batch's end and validation step, which every rank reaches in the
same order: a signal that reached any one rank stops them all at the same step.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

CTRL_C_NOTE = (
    "\nCtrl-C: stopping after the optimizer step under way (and its validation, if one is due) and "
    "saving last.ckpt; press Ctrl-C again to stop at once.\n"
)


class StopSignals:
    """The stop signal noted on this process (`noted`), and the one agreed on by every rank.

    `unheeded` (the class's, one per process): the signal agreed on as the newest training run
    ended on its own, during its last validation, with no step left to stop at (`SaveLast` sets it
    at each run's start and end); `stop_if_unheeded` stops there once that run's results are kept.
    """

    unheeded: signal.Signals | None = None

    def __init__(self) -> None:
        self.noted: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._pid: int | None = None
        self._group: Any = None  # the ranks' group for the agreement, where there are several
        self._speaks = True  # the first process: prints the Ctrl-C note

    def install(self, trainer) -> None:
        """On every rank as training starts (after Lightning's own handlers, which come back at its
        teardown): the handlers, and under DDP a CPU (gloo) group, so that agreeing never waits on
        the GPU's queue."""
        self.noted, self._speaks, self._group = None, trainer.is_global_zero, None
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            self._group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there
        self._pid = os.getpid()
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is signal.SIG_IGN:  # ignored where the run started (a script's `&`):
                continue  # ignored still, as Python leaves an inherited SIG_IGN
            previous = signal.signal(signum, self._on_signal)
            self._previous[signum] = (
                signal.SIG_DFL if previous is None else previous
            )  # None: set outside Python

    def _on_signal(self, signum: int, frame) -> None:
        if os.getpid() != self._pid:
            return  # a data loader's worker (forked with this handler): the main process stops it
        if self.noted is not None and signum == signal.SIGINT:  # the second Ctrl-C: stop now, as Python would
            self.restore()
            raise KeyboardInterrupt
        if self.noted is None and signum == signal.SIGINT and self._speaks:
            try:  # os.write, not print: the handler may interrupt a print to the same stream
                os.write(sys.__stderr__.fileno(), CTRL_C_NOTE.encode())
            except (OSError, ValueError, AttributeError):
                pass
        self.noted = signal.Signals(max(int(self.noted or 0), signum))  # SIGTERM over SIGINT, as `agreed`

    def agreed(self) -> signal.Signals | None:
        """The signal any rank noted (SIGTERM over SIGINT), the same on every rank: under DDP a
        collective, so every rank must ask at the same point."""
        found = int(self.noted or 0)
        if self._group is not None:
            flag = torch.tensor([found])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            found = int(flag)
        return signal.Signals(found) if found else None

    def restore(self) -> None:
        """The handlers from before `install`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


def stop_if_unheeded(what: str) -> None:
    """The stop a signal asked for as the newest run ended on its own, taken now that its results
    are kept (`what`, said on the first process): Lightning's `SIGTERMException`, whose code
    names the signal, as a stop inside a run ends (a suite does not go on to its next run)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    signum, StopSignals.unheeded = StopSignals.unheeded, None
    if signum is not None:
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"{signum.name}: stopped after {what}", flush=True)
        raise SIGTERMException(128 + signum)
