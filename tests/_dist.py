"""Run a function on N real ``torch.distributed`` processes (Gloo on CPU) and collect results.

Multi-rank tests use this instead of mocks: each rank is a spawned Python process
with its own process group, exactly as in a real job (Gloo on CPU; NCCL with one GPU
per rank when ``backend="nccl"``).

    results = run_distributed(my_fn, world_size=4, args=(...))

``my_fn(rank, world_size, *args)`` must be a module-level function (spawned
processes import it by name). Each process has ``torch.distributed`` initialised
with Gloo before ``my_fn`` runs and destroyed after. The return values, in rank
order, must be picklable. An exception on any rank is re-raised here with that
rank's traceback; a rank that does not finish within ``timeout`` seconds fails
the test naming the ranks still running.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from typing import Any, Callable, Sequence


EXITED = "exited without reporting"
"""The result of a rank in ``may_exit`` whose process ended without reporting."""


class DistributedTestError(AssertionError):
    """A rank raised, or did not finish in time."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, args, env, queue, backend="gloo"):  # runs in the child
    try:
        os.environ.update(env)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "nccl":  # one GPU per rank, as torchrun's LOCAL_RANK would pick
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        try:
            result = fn(rank, world_size, *args)
            # reported before the teardown: a rank whose groups were aborted (fault tests) must not
            # lose its result if destroying the broken groups hangs; the parent kills it then
            queue.put((rank, True, result))
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a failed rank may leave the group broken
                pass
        return
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, False, traceback.format_exc()))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    backend: str = "gloo",
    may_exit: Sequence[int] = (),
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results by rank.

    ``backend="nccl"`` puts rank ``r`` on GPU ``r`` (tests/multigpu uses it); the default is Gloo on CPU.
    ``may_exit``: ranks whose process may end without reporting (a test that kills a rank on purpose);
    their result is :data:`EXITED`. The rendezvous port is picked free and released before rank 0 binds
    it, so another process may take it in between: a launch whose rank 0 could not bind it is started
    again on a new port (up to three times), as a job launcher would.
    """
    for attempt in range(3):
        try:
            return _launch(fn, world_size, args, timeout=timeout, env=env, backend=backend, may_exit=may_exit)
        except _PortTaken:
            if attempt == 2:
                raise DistributedTestError("the rendezvous port was taken by another process three times")
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    """Rank 0 could not bind the rendezvous port (another process took it after it was picked)."""


def _port_taken(tb: str) -> bool:
    return "init_process_group" in tb and ("EADDRINUSE" in tb or "Address already in use" in tb)


def _launch(fn, world_size, args, *, timeout, env, backend, may_exit) -> list[Any]:
    """One launch of :func:`run_distributed` on one port."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, port, tuple(args), dict(env or {}), queue, backend),
                    daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    import queue as _q
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(results) - set(errors))
                raise DistributedTestError(
                    f"ranks {missing} did not finish within {timeout:.0f}s"
                    + "".join(f"\n--- rank {r} raised:\n{tb}" for r, tb in sorted(errors.items()))
                )
            try:
                rank, ok, payload = queue.get(timeout=min(remaining, 1.0))
            except _q.Empty:
                gone = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in results and r not in errors]
                for r in gone:
                    if r in may_exit:
                        results[r] = EXITED
                    elif procs[r].exitcode != 0:
                        errors[r] = f"process exited with code {procs[r].exitcode} without reporting"
                continue
            (results if ok else errors)[rank] = payload
            if not ok and _port_taken(payload) and not results:
                raise _PortTaken(payload)
            if errors:
                # give the others a moment to report, then stop waiting for ranks that may now hang
                deadline = min(deadline, time.monotonic() + 10.0)
    finally:
        for p in procs:
            p.join(timeout=0.5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if errors:
        raise DistributedTestError(
            "".join(f"\n--- rank {r} raised:\n{tb}" for r, tb in sorted(errors.items()))
        )
    return [results[r] for r in range(world_size)]
