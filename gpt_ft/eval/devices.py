"""The device a command (`--device`) or a `Classifier` (`device=`) runs on, checked before any work:
torch knows it, and sees it on this machine."""

from __future__ import annotations

import torch


def device_named(device: str | None, option: str = "--device") -> str:
    """The device to run on as given, checked (torch knows it, CUDA sees it); None: cuda or else cpu."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"

    def said(value: str, quoted: bool = False) -> str:
        """How a message names the argument: `--device 'x'`, `--device cuda`; from Python `device='x'`."""
        shown = repr(value) if quoted or not option.startswith("-") else value
        return f"{option} {shown}" if option.startswith("-") else f"{option}={shown}"

    try:
        named = torch.device(device)
    except RuntimeError:
        named = None
    mps = named is not None and named.type == "mps" and torch.backends.mps.is_available()
    if named is None or named.type not in ("cpu", "cuda") and not mps:  # meta, or one not built in
        raise ValueError(f"{said(device, quoted=True)} is not a device: give cpu, cuda or cuda:N.")
    if named.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{said(device)}: torch sees no CUDA device here; give {said('cpu')}.")
        if named.index is not None and named.index >= count:
            seen = f"cuda:0 to cuda:{count - 1}" if count > 1 else "cuda:0"
            raise ValueError(f"{said(device)}: torch sees {count} CUDA device(s), {seen}.")
    return device
