"""``--device`` checked before a command runs: ``cpu``, ``cuda`` or ``cuda:N`` that exists in this process."""
from __future__ import annotations

import torch

from refimpl.cli_errors import CliInputError


def check_device(text: str | None, option: str = "--device") -> str | None:
    """Return ``text`` when it names a usable device (``None`` passes); otherwise raise :class:`CliInputError`."""
    if text is None:
        return None
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise CliInputError(f"{option} {text!r}: expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise CliInputError(f"{option} {text!r}: expected cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise CliInputError(f"{option} {text}: CUDA is not available in this process; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CliInputError(f"{option} {text}: this process sees {torch.cuda.device_count()} CUDA device(s)")
    return text


__all__ = ["check_device"]
