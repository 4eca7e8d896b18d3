"""Wake NCCL's UDS proxy thread that a communicator's destroy is joining, so the destroy does not wait out its poll.

[Note: the proxy's 500 ms poll, woken]
Every NCCL communicator (2.19 and later, cuMem builds) runs a "UDS service" thread that
``poll()``\\ s its Unix datagram socket with a 500 ms timeout and looks at its stop flag only when
the poll returns (``ncclProxyServiceUDS`` in NCCL's ``src/proxy.cc``). ``ncclCommDestroy`` (torch's
``ProcessGroup.shutdown``) sets that flag and then *joins* the thread, and only after the join frees
the communicator's device memory (``commFree``). So every destroy waits, after the flag is set, for
the rest of the thread's current poll period: uniformly 0 to 0.5 s, measured on the H200s as whole
numbers of 500 ms polls after the communicator's last request (the destroy-walk probe record). That
wait is pure idling: nothing is being freed or flushed.

A datagram on the socket ends the poll at once. :class:`ProxyWaker` watches the thread that runs a
destroy; when that thread is blocked in ``pthread_join`` (a ``futex`` wait whose value is the tid of
the thread being joined, readable in ``/proc/self/task/<tid>/syscall``) on a thread named
``NCCL UDS Service`` (NCCL names it so), it reads that thread's poll descriptor (its ``poll`` call's
first argument, read through ``/proc/self/mem``, which returns an error rather than faulting if the
stack is gone) and sends one datagram to the socket's own address. By then the stop flag is set (NCCL
sets it before joining), so the woken thread breaks out of its loop without reading the datagram;
and only the thread being joined is ever woken, so no live communicator sees a stray message.

Anything unexpected (another OS or architecture, no ``/proc``, a different NCCL layout, a glibc whose
join is not a futex wait on the tid, a thread that exits while being looked at) makes the waker do
nothing: the destroy then waits for the poll as before. It never changes what is destroyed or freed,
only when the join returns.
"""
from __future__ import annotations

import logging
import os
import platform
import socket
import struct
import threading
from typing import Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: syscall numbers by machine: (futex, poll, ppoll)
_SYSCALLS = {"x86_64": (202, 7, 271), "aarch64": (98, None, 73)}
_FUTEX_WAIT_OPS = {0, 9}  # FUTEX_WAIT, FUTEX_WAIT_BITSET (the private flag is masked off)
_UDS_THREAD = "NCCL UDS"
_UDS_POLL_MS = 500  # ncclProxyServiceUDS: poll(pollfds, 1, 500)
#: what is sent: a few bytes the UDS thread never reads (it sees its stop flag first)
_DATAGRAM = b"\xff\xff\xff\xff"


def supported() -> bool:
    """True where the waker can work: Linux on x86_64 or aarch64 with ``/proc/self/task``."""
    return platform.machine() in _SYSCALLS and os.path.isdir("/proc/self/task")


def _syscall(tid: int) -> list[int] | None:
    """``[nr, arg0..arg5]`` of the syscall thread ``tid`` of this process is blocked in, or None."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) < 7 or fields[0] in ("running", "-1"):
        return None
    try:
        return [int(fields[0])] + [int(x, 16) for x in fields[1:7]]
    except ValueError:
        return None


def _thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def joined_thread(tid: int) -> int | None:
    """The tid of the thread that thread ``tid`` waits for in ``pthread_join`` (a futex wait on the joined
    thread's tid), or None."""
    futex, _, _ = _SYSCALLS.get(platform.machine(), (None, None, None))
    call = _syscall(tid)
    if call is None or call[0] != futex or (call[2] & 0x7F) not in _FUTEX_WAIT_OPS:
        return None
    target = call[3]
    if target <= 0 or not os.path.isdir(f"/proc/self/task/{target}"):
        return None
    return target


def _read_mem(address: int, fmt: str) -> tuple[int, ...] | None:
    """``struct.unpack(fmt, ...)`` of this process's memory at ``address``, read through ``/proc/self/mem`` (an
    error, never a fault, where the address is no longer mapped); None if it cannot be read whole."""
    size = struct.calcsize(fmt)
    try:
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            raw = mem.read(size)
    except (OSError, OverflowError, ValueError):
        return None
    return struct.unpack(fmt, raw) if len(raw) == size else None


def poll_fd(tid: int) -> int | None:
    """The descriptor thread ``tid`` is polling, if it is in ``poll``/``ppoll`` on exactly one descriptor."""
    _, poll, ppoll = _SYSCALLS.get(platform.machine(), (None, None, None))
    call = _syscall(tid)
    if call is None or call[0] not in (poll, ppoll) or call[2] != 1:
        return None
    got = _read_mem(call[1], "i")  # struct pollfd starts with its descriptor
    return got[0] if got is not None and got[0] >= 0 else None


def _poll_timeout_ms(call: list[int]) -> int | None:
    """The timeout in ms of a ``poll`` (third argument) or ``ppoll`` (a timespec at the third argument) call."""
    _, poll, _ = _SYSCALLS.get(platform.machine(), (None, None, None))
    if call[0] == poll:
        return call[3]
    got = _read_mem(call[3], "qq")
    return None if got is None else got[0] * 1000 + got[1] // 1_000_000


def uds_poll_fd(tid: int) -> int | None:
    """The socket of thread ``tid`` if it is NCCL's UDS service thread in its poll, else None.

    Recognised by name where NCCL names its threads (``NCCL_SET_THREAD_NAME=1``: "NCCL UDS Service")
    or else by what the thread does: one descriptor polled with NCCL's 500 ms timeout. The descriptor
    must be a Unix datagram socket (checked where it is woken, :func:`wake_socket`).
    """
    _, poll, ppoll = _SYSCALLS.get(platform.machine(), (None, None, None))
    call = _syscall(tid)
    if call is None or call[0] not in (poll, ppoll) or call[2] != 1:
        return None
    if not _thread_name(tid).startswith(_UDS_THREAD) and _poll_timeout_ms(call) != _UDS_POLL_MS:
        return None
    return poll_fd(tid)


def wake_socket(fd: int) -> bool:
    """Send one datagram to the Unix datagram socket ``fd`` of this process (to its own address); True if sent."""
    try:
        dup = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if dup.family != socket.AF_UNIX or dup.type != socket.SOCK_DGRAM:
            return False
        name = dup.getsockname()
        if not name:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.setblocking(False)
            out.sendto(_DATAGRAM, name)
        return True
    except OSError:
        return False
    finally:
        dup.close()


class ProxyWaker:
    """While thread ``tid`` runs NCCL destroys, wake each UDS proxy thread it joins (see the module Note).

    Use as a context manager around the destroy, on the destroying thread (``tid`` defaults to the
    caller's). ``period_s``: how often the watcher looks. ``woken`` counts the threads woken.
    """

    def __init__(self, tid: int | None = None, period_s: float = 0.001) -> None:
        self.tid = threading.get_native_id() if tid is None else tid
        self.period_s = period_s
        self.woken = 0
        self._done: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ProxyWaker":
        if supported():
            self._thread = threading.Thread(target=self._watch, name="timeshare-proxy-waker", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.look()
            except Exception as e:  # noqa: BLE001 - never let the waker disturb a destroy
                log.debug("proxy waker stopped looking: %r", e)
                return

    def look(self) -> bool:
        """One look: if the watched thread is joining a UDS proxy thread not woken yet, wake it. True if woken."""
        target = joined_thread(self.tid)
        if target is None or target in self._done:
            return False
        fd = uds_poll_fd(target)
        if fd is None or not wake_socket(fd):
            return False
        self._done.add(target)
        self.woken += 1
        return True


def with_proxy_waker(fn: Callable[[], T]) -> T:
    """``fn()`` (a destroy on this thread) with a :class:`ProxyWaker` watching this thread."""
    with ProxyWaker():
        return fn()


__all__ = ["ProxyWaker", "joined_thread", "poll_fd", "supported", "uds_poll_fd", "wake_socket", "with_proxy_waker"]
