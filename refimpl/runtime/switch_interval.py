"""The interpreter's switch interval, lowered while a helper thread of ours must get the GIL back quickly.

[Note: the GIL's switch interval]
A thread that returns from a call made without the GIL (a CUDA event's wait,
a collective, a rendezvous on a TCP store) needs the GIL back to go on. It
gets it only once the thread holding it has run for the interpreter's switch
interval (``sys.getswitchinterval()``, 5 ms by default), and in a training
step the thread holding it is the one launching the step (FSDP2's hooks, the
optimizer stepped in the backward, the autograd engine's Python callbacks).
So every such return costs a helper thread up to 5 ms whenever the main
thread runs Python:

* the copy pacer's feeder, between windows (a 128-MiB window copies in
  2.4 ms at 55 GB/s): [Note: the feeder's GIL] in
  :mod:`refimpl.torch_runtime.copy_stream`. On a CPU a thread woken every 2 ms
  beside a thread running Python got the GIL back 5.3 ms late (median of 50),
  0.7 ms late at an interval of 0.5 ms, 0.4 ms at 0.2 ms;
* a lifecycle resume run beside the next training step
  (:class:`~refimpl.comm.overlap.OverlappedSwitch`'s background moves): it
  rebuilds each group, creates its communicator and agrees, one return from a
  call without the GIL after another. With one rank and two groups
  (``python bench/resume_gil_probe.py``) such a resume took 1.5 ms beside an
  idle main thread, 53.5 ms beside one running Python at the interpreter's
  5 ms and 4.1 ms at 0.2 ms on a CPU (Gloo); 1.1, 84.4 and 4.4 ms on one H200
  (NCCL).

While such a thread runs, the interval is lowered to
:data:`RESPONSIVE_SWITCH_INTERVAL_S` and restored after; every user of the
process shares one lowering (:data:`SWITCH_INTERVAL`): the value before the
first lowering comes back after the last, and a value already lower (the
user's own) is kept. What it costs the main thread: at most one switch every
0.2 ms while a helper waits for the GIL (a switch is microseconds), and only
while one of these threads is alive.
"""
from __future__ import annotations

import sys
import threading

#: the switch interval while a helper thread of ours must get the GIL back quickly (seconds)
RESPONSIVE_SWITCH_INTERVAL_S = 0.0002


class SwitchInterval:
    """The interpreter's switch interval lowered while any user holds a lowering, restored when none does: the
    value before the first lowering comes back, and a value already lower is kept ([Note: the GIL's switch
    interval])."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: float | None = None

    def lower(self, seconds: float) -> None:
        """One more user wants at most ``seconds``."""
        with self._lock:
            if self._users == 0:
                self._saved = sys.getswitchinterval()
            self._users += 1
            if seconds < sys.getswitchinterval():
                sys.setswitchinterval(seconds)

    def restore(self) -> None:
        """One user is done; the last one puts the saved interval back."""
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0 and self._saved is not None:
                sys.setswitchinterval(self._saved)
                self._saved = None

    @property
    def users(self) -> int:
        """How many users hold a lowering now."""
        return self._users


#: the one lowering every user of the process shares (the copy pacers, the switch's background threads)
SWITCH_INTERVAL = SwitchInterval()


def check_switch_interval(name: str, seconds: float | None) -> float | None:
    """``seconds`` as a switch interval to lower to (None: leave the interpreter's); ValueError naming ``name`` for
    anything but None or a number in (0, 1]."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 1:
        raise ValueError(f"{name} must be None or in (0, 1] seconds, got {seconds!r}")
    return float(seconds)


__all__ = ["RESPONSIVE_SWITCH_INTERVAL_S", "SWITCH_INTERVAL", "SwitchInterval", "check_switch_interval"]
