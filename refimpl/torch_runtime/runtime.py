"""TorchRuntime: the runtime seam on real tensors, CUDA streams and ``torch.distributed``.

Theory of operation
-------------------
Every awaitable of this runtime completes before it is awaited or while it is
awaited, without suspending the coroutine, so :meth:`Runtime.run` (``run_sync``)
drives protocol code to completion synchronously.

* Memory: device buffers come from the caching allocator on :attr:`device`;
  host buffers from :class:`refimpl.torch_runtime.pinning.HostPinner`, page-locked at
  their exact size with ``cudaHostRegister`` (plain memory without CUDA).
* Copies (CUDA): one dedicated copy stream per runtime. Before each copy it
  waits on the current (compute) stream, so the copy reads the values the
  queued compute produces; device sources are ``record_stream``-ed on the copy
  stream so the caching allocator cannot hand their blocks out early; an event
  marks the end of the copy. Awaiting the completion synchronizes that event
  and makes the current stream wait on it, so later compute sees the copied
  bytes. On CPU a copy is done at once and returns :class:`Ready`.
* Groups: ``"world"`` is the default process group. :meth:`new_group` calls
  ``dist.new_group`` on every rank (torch requires it); the spec is kept so
  :meth:`recreate_group` can rebuild with the same arguments. torch gives every
  ``new_group`` call a fresh store prefix (its group name); it is recorded in
  :meth:`torch_group_name`. Without an initialised ``torch.distributed`` the
  runtime is a single-rank world whose collectives are local copies.
* Suspend/resume delegates to :mod:`refimpl.torch_runtime.nccl`; the suspended flag is
  checked before any collective touches the communicator.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from refimpl.runtime.base import (
    WORLD,
    AddressInUseError,
    CollectiveFailedError,
    CollectiveTimeoutError,
    CommMemory,
    Completion,
    CopyKind,
    CopyStats,
    GroupError,
    GroupSpec,
    GroupSuspendedError,
    MemoryInfo,
    ReduceOp,
    Runtime,
)
from refimpl.runtime.switch_interval import check_switch_interval
from refimpl.runtime.votes import Ballot, Verdict
from refimpl.torch_runtime.proxy_wake import ProxyWaker, supported as proxy_wake_supported
from refimpl.torch_runtime.copy_stream import CopyEngine
from refimpl.torch_runtime.device_cache import DeviceCache
from refimpl.torch_runtime.foreign_groups import AdoptedGroups, foreign_spec
from refimpl.torch_runtime.pinning import DEFAULT_CUDA_PREFAULT, PREFAULT_MODES, HostPinner, host_memory
from refimpl.torch_runtime.rendezvous import backend_options, check_in, rendezvous_port
from refimpl.torch_runtime.votes import StoreBallotBox, next_space

logger = logging.getLogger(__name__)

_TORCH_OPS = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX}


@dataclass
class _Group:
    """What this runtime knows about one named group."""

    spec: GroupSpec
    pg: Any  # torch ProcessGroup; None for a local (undistributed) group or a non-member
    live: bool = True
    suspended: bool = False
    handles: list[int] = field(default_factory=list)
    torch_name: str = ""
    store: Any = None  # the group's own rendezvous store (option "rendezvous_port"), kept while live


class TorchRuntime(Runtime):
    """The runtime on real torch: CUDA (NCCL) when available, else CPU (Gloo).

    ``device``: where :meth:`alloc_device` places buffers; defaults to
    ``cuda:<current>`` when CUDA is available, else ``cpu``.
    ``default_backend``: backend of groups whose spec says ``None``; defaults to
    ``"nccl"`` on CUDA and ``"gloo"`` on CPU.
    ``pin_prefault``: how pinned host buffers are faulted in before
    ``cudaHostRegister`` (:data:`refimpl.torch_runtime.pinning.PREFAULT_MODES`);
    defaults to the environment variable ``TIMESHARE_PIN_PREFAULT``, else
    ``DEFAULT_CUDA_PREFAULT`` (``"touch"``: registering memory already touched is
    several times faster than registering untouched memory; docs/store.md has the
    figures) with CUDA and ``"none"`` without.
    ``device_cache``: what :meth:`empty_cache` gives back and where the store's flat buffers come from
    (:data:`refimpl.torch_runtime.device_cache.DEVICE_CACHE_MODES`; default: the environment variable
    ``TIMESHARE_DEVICE_CACHE``, else ``"shared"``).
    ``wake_proxies``: destroy NCCL communicators with a :class:`~refimpl.torch_runtime.proxy_wake.ProxyWaker`
    (the destroy does not wait out its UDS proxy thread's 500 ms poll; docs/comm.md has the figures); default: on with CUDA unless the environment variable
    ``TIMESHARE_WAKE_PROXIES`` is ``0``. ``proxy_wakes`` counts the proxy threads woken.
    """

    def __init__(self, device: torch.device | str | None = None, *, default_backend: str | None = None,
                 pin_prefault: str | None = None, device_cache: str | None = None,
                 wake_proxies: bool | None = None) -> None:
        if device is None:
            device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"TorchRuntime(device={device}): CUDA is not available in this process")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._cuda = device.type == "cuda"
        self.default_backend = default_backend or ("nccl" if self._cuda else "gloo")
        self.copy_stats = CopyStats()
        cuda_present = torch.cuda.is_available()
        if pin_prefault is None:
            env = os.environ.get("TIMESHARE_PIN_PREFAULT")
            if env and env not in PREFAULT_MODES:
                raise ValueError(f"TIMESHARE_PIN_PREFAULT={env!r} is not a prefault mode; use one of {PREFAULT_MODES} "
                                 "or unset it")
            pin_prefault = env or (DEFAULT_CUDA_PREFAULT if cuda_present else "none")
        self.pinner = HostPinner(use_cuda=cuda_present, prefault=pin_prefault)
        self.device_cache = DeviceCache(device, device_cache or os.environ.get("TIMESHARE_DEVICE_CACHE") or "shared")
        if wake_proxies is None:
            wake_proxies = os.environ.get("TIMESHARE_WAKE_PROXIES", "1").strip() not in ("0", "false", "no", "off")
        self.orders_on_device = True  # a copy's completion orders the caller's stream after it (copy_stream.py)
        self.wake_proxies = bool(wake_proxies) and self._cuda and proxy_wake_supported()
        self.proxy_wakes = 0
        self._copies = CopyEngine(device, self.copy_stats)
        self._distributed = dist.is_available() and dist.is_initialized()
        if self._distributed:
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            world_backend = str(dist.get_backend())
            world_pg = dist.group.WORLD
        else:
            self.rank, self.world_size, world_backend, world_pg = 0, 1, self.default_backend, None
        world_spec = GroupSpec(WORLD, tuple(range(self.world_size)), backend=world_backend)
        self._groups: dict[str, _Group] = {WORLD: _Group(world_spec, world_pg, torch_name=self._pg_name(world_pg))}
        self._point_hooks: dict[str, list[Callable[[], None]]] = {}
        self._ballots = StoreBallotBox(_default_store if self._distributed else lambda: None, self.rank)
        self._adopted = AdoptedGroups()  # groups a framework made (refimpl.torch_runtime.foreign_groups)
        self._rebuilt_hooks: list[Callable[[str, str, Any], None]] = []
        logger.debug("TorchRuntime rank %d/%d on %s (distributed=%s)", self.rank, self.world_size, device,
                     self._distributed)

    # ------------------------------------------------------------------ points

    def on_point(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` each time protocol code reaches the point ``name`` (on the thread that reaches it, e.g.
        ``"store.reload.wait"``: a reload's copies are issued and its tensors re-pointed). Returns a function
        that removes the hook. An exception ``fn`` raises fails the operation at that point."""
        self._point_hooks.setdefault(name, []).append(fn)

        def remove() -> None:
            hooks = self._point_hooks.get(name, [])
            if fn in hooks:
                hooks.remove(fn)

        return remove

    def bind_thread(self) -> None:
        """Make :attr:`device` the calling thread's current CUDA device (a new thread starts on device 0)."""
        if self._cuda:
            torch.cuda.set_device(self.device)

    async def point(self, name: str) -> None:
        """Run the hooks :meth:`on_point` registered for ``name`` (nothing else happens at a point here)."""
        for fn in tuple(self._point_hooks.get(name, ())):
            fn()

    # ------------------------------------------------------------------ votes and arrivals

    async def vote(self, key: str, ranks: Sequence[int], point: str, code: int = 0, marks: Iterable[int] = (), *,
                   timeout_s: float, wait: bool = True) -> Verdict | None:
        """:meth:`Runtime.vote` through the job's rendezvous store (see :mod:`refimpl.torch_runtime.votes`)."""
        ballot = Ballot(self.rank, point, code, frozenset(marks))
        if not self._distributed:
            return await super().vote(key, ranks, point, code, marks, timeout_s=timeout_s, wait=wait)
        return self._ballots.vote(key, tuple(ranks), ballot, timeout_s, wait)

    def vote_space(self, kind: str, about: str = "") -> str:
        """A key space numbered per process and per ``about``: every TorchRuntime of the process votes in the same
        store (see :meth:`Runtime.vote_space <refimpl.runtime.base.Runtime.vote_space>`)."""
        return next_space(kind, about)

    def mark_arrival(self, group: str, point: str) -> None:
        """Count this arrival in the rendezvous store (one ``add``)."""
        self._ballots.mark(self._entry(group).spec, point)

    def absent_ranks(self, group: str, point: str) -> tuple[int, ...] | None:
        """Members whose count at ``point`` is below this rank's (read from the rendezvous store)."""
        return self._ballots.absent(self._entry(group).spec, point)

    # ------------------------------------------------------------------ memory

    def alloc_device(self, numel: int, dtype: torch.dtype, *, tag: str = "") -> torch.Tensor:
        """A new 1-D buffer of ``numel`` elements on :attr:`device` (the store's flat buffers, tags
        ``store.flat.*``, from the private pool with ``device_cache="private"``)."""
        return self.device_cache.alloc(numel, dtype, tag)

    def alloc_host(self, numel: int, dtype: torch.dtype, *, pinned: bool = True, tag: str = "") -> torch.Tensor:
        """A new 1-D host buffer; pinned at its exact size with ``cudaHostRegister`` when CUDA is present."""
        return self.pinner.alloc(numel, dtype, pinned=pinned, tag=tag)

    def free_host(self, tensor: torch.Tensor) -> None:
        """Unpin a buffer from :meth:`alloc_host`; its memory goes when the last reference does."""
        self.pinner.free(tensor)

    @property
    def pinned_bytes(self) -> int:
        """Bytes pinned now through :meth:`alloc_host` (marked pinned, without CUDA)."""
        return self.pinner.pinned_bytes

    @property
    def pin_registrations(self) -> int:
        """How many pinned buffers :meth:`alloc_host` has created over this runtime's life."""
        return self.pinner.registrations

    def release(self, tensor: torch.Tensor) -> None:
        """Resize the tensor's storage to 0 bytes; the allocator gets the block back."""
        tensor.untyped_storage().resize_(0)

    def empty_cache(self) -> None:
        """Return cached unused device blocks to the driver, as :attr:`device_cache` says: all of them
        (``"shared"``: ``torch.cuda.empty_cache``), the store's private pool only (``"private"``) or none
        (``"keep"``: the next role in this process reuses them)."""
        self.device_cache.empty()

    def memory_info(self) -> MemoryInfo:
        """``cudaMemGetInfo`` on CUDA; available/total host memory on CPU."""
        if self._cuda:
            free, total = torch.cuda.mem_get_info(self.device)
        else:
            free, total = host_memory()
        return MemoryInfo(free=int(free), total=int(total))

    # ------------------------------------------------------------------ copies

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, kind: CopyKind) -> Completion:
        """Copy ``src`` into ``dst`` after the compute already queued; await the result before use.

        On CUDA the copy runs on this runtime's copy stream (see :mod:`refimpl.torch_runtime.copy_stream`).
        """
        return self._copies.copy(dst, src, kind)

    def paced_copies(self, window_bytes: int | None) -> contextlib.AbstractContextManager[None]:
        """See :meth:`Runtime.paced_copies`: on CUDA, copies asked for inside are fed to the device ``window_bytes``
        at a time by a feeder thread."""
        return self._copies.paced(window_bytes)

    @property
    def pacer_switch_interval_s(self) -> float | None:
        """The interpreter's switch interval while paced copies are held (seconds; None: the interpreter's own):
        the feeder thread issuing each window needs the GIL back quickly ([Note: the feeder's GIL] in
        :mod:`refimpl.torch_runtime.copy_stream`; default :data:`~refimpl.torch_runtime.copy_stream.PACED_SWITCH_INTERVAL_S`)."""
        return self._copies.switch_interval_s

    @pacer_switch_interval_s.setter
    def pacer_switch_interval_s(self, seconds: float | None) -> None:
        """Set it: seconds in (0, 1], or None for the interpreter's own; anything else raises ValueError."""
        self._copies.switch_interval_s = check_switch_interval("pacer_switch_interval_s", seconds)

    def copies_on_sms(self, ctas: int | None) -> contextlib.AbstractContextManager[None]:
        """See :meth:`Runtime.copies_on_sms`: on CUDA, host-to-device copies from pinned host memory asked for inside
        are made by a Triton kernel of ``ctas`` programs ([Note: copies on SMs] in
        :mod:`refimpl.torch_runtime.sm_copy`)."""
        return self._copies.on_sms(ctas)

    def prepare_copies_on_sms(self) -> None:
        """See :meth:`Runtime.prepare_copies_on_sms`: on CUDA the kernel is built and run once on a few bytes."""
        if self._cuda:
            self._copies.sm.warm(self.device)

    @property
    def sm_copies(self) -> int:
        """Host-to-device copies made on SMs so far (inside :meth:`copies_on_sms`)."""
        return self._copies.sm.copies

    async def synchronize(self) -> None:
        """Wait for all queued work on :attr:`device`."""
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def settle_device(self) -> None:
        """Synchronize the current (compute) stream of :attr:`device` (nothing on CPU): spans end with their work.

        NCCL collectives issued with ``async_op=True`` and waited with
        ``work.wait()`` only make the current stream wait for the collective;
        the host goes on at once. Without this, a span around a 4 GB all-gather
        read 0.4 ms (issue 10). The current stream is what a phase's work
        drains into: collectives (``work.wait``), awaited copies (their
        completion makes it wait on the copy event) and compute. Copies issued
        but not yet awaited (a prefetch for the next phase on the copy stream)
        are not waited for, so a span does not stall the pipelined dedup reload.
        """
        if self._cuda:
            torch.cuda.current_stream(self.device).synchronize()

    # ------------------------------------------------------------------ groups

    async def new_group(self, spec: GroupSpec) -> None:
        """Create ``spec.name`` with ``dist.new_group``; every rank must call it, in the same order."""
        old = self._groups.get(spec.name)
        if old is not None and (old.live or spec.name == WORLD):
            raise GroupError(f"group {spec.name!r} already exists; destroy it first or use another name")
        bad = [r for r in spec.ranks if not 0 <= r < self.world_size]
        if bad:
            raise GroupError(f"group {spec.name!r}: ranks {bad} are outside the world of {self.world_size} ranks")
        pg, store = self._create_checked(spec)
        self._groups[spec.name] = _Group(spec, pg, torch_name=self._pg_name(pg), store=store)

    def _create_checked(self, spec: GroupSpec, extra: dict[str, Any] | None = None) -> tuple[Any, Any]:
        """:meth:`_create`, then, for a group with its own rendezvous port, the members' check-in there
        (see :mod:`refimpl.torch_runtime.rendezvous`); on a failed check-in the new group is destroyed again."""
        port = rendezvous_port(spec)
        pg = self._create(spec, extra)
        if port is None or not self._distributed or self.rank not in spec.ranks:
            return pg, None
        try:
            return pg, check_in(spec, self.rank, port)
        except BaseException:
            if pg is not None:
                try:
                    dist.destroy_process_group(pg)
                except Exception as e:  # noqa: BLE001 - the check-in error is the one to raise
                    logger.warning("destroying group %r after a failed check-in raised %s", spec.name, e)
            raise

    def _create(self, spec: GroupSpec, extra: dict[str, Any] | None = None) -> Any:
        """Build the torch process group for ``spec`` (None on non-members and without dist); ``extra``: more
        ``dist.new_group`` arguments (an adopted group's ``pg_options`` and ``group_desc``)."""
        if not self._distributed:
            return None
        backend = spec.backend or self.default_backend
        kwargs: dict[str, Any] = dict(timeout=timedelta(seconds=spec.timeout_s), backend=backend, **(extra or {}))
        if backend_options(spec):
            kwargs["pg_options"] = self._pg_options(spec, backend)
        try:
            pg = dist.new_group(list(spec.ranks), **kwargs)
        except Exception as e:  # noqa: BLE001 - classified below
            if _address_in_use(e):
                raise AddressInUseError(
                    f"group {spec.name!r} (generation {spec.generation}) could not bind its rendezvous "
                    f"address: {e}. Wait for the port's TIME_WAIT to pass (the lifecycle's cooldown) and retry."
                ) from e
            raise GroupError(f"dist.new_group for group {spec.name!r} ranks {spec.ranks} failed: {e}") from e
        if pg is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        return pg

    @staticmethod
    def _pg_options(spec: GroupSpec, backend: str) -> Any:
        """Backend options from ``spec.options``: ``("name", v)`` sets ``opts.name``, ``("config.name", v)``
        sets ``opts.config.name`` (NCCL only)."""
        if backend != "nccl":
            raise GroupError(
                f"group {spec.name!r}: options {dict(backend_options(spec))} are NCCL process-group options but the "
                f"backend is {backend!r}; drop the options or use backend='nccl'"
            )
        opts = dist.ProcessGroupNCCL.Options()
        for key, value in backend_options(spec):
            target, attr = (opts.config, key[len("config."):]) if key.startswith("config.") else (opts, key)
            if not hasattr(target, attr):
                raise GroupError(f"group {spec.name!r}: unknown NCCL option {key!r}")
            setattr(target, attr, value)
        return opts

    @staticmethod
    def _pg_name(pg: Any) -> str:
        if pg is None:
            return ""
        try:
            return str(pg.group_name)
        except Exception:  # noqa: BLE001 - older builds; the name is informational
            return ""

    def torch_group_name(self, name: str) -> str:
        """torch's name (store prefix) of the group's current process group; "" where there is none."""
        return self._entry(name).torch_name

    def _take_down(self, name: str) -> Any:
        """Mark the group destroyed in this runtime's view and hand back its process group (None: never created);
        raises GroupError for ``"world"`` and for a group already destroyed."""
        if name == WORLD:
            raise GroupError("the 'world' group is never destroyed; destroy subgroups only")
        g = self._entry(name)
        if not g.live:
            raise GroupError(f"group {name!r} is already destroyed; recreate_group({name!r}) rebuilds it")
        pg, g.pg, g.live, g.suspended, g.handles = g.pg, None, False, False, []
        g.store = None  # closes the group's own rendezvous port, if it has one
        self._adopted.retire(name, pg)  # an adopted group's object: kept until its rebuild re-points it
        return pg

    def _guarded(self, what: str, name: str, fn: Callable[[Any], Any], pg: Any) -> None:
        """``fn(pg)`` (a destroy or abort: with a proxy waker watching this thread where ``wake_proxies``); a
        failure is logged, not raised: the group is gone from our view either way."""
        try:
            if self.wake_proxies:
                with ProxyWaker() as waker:
                    fn(pg)
                self.proxy_wakes += waker.woken
            else:
                fn(pg)
        except Exception as e:  # noqa: BLE001
            logger.warning("%s group %r raised %s; treating it as destroyed", what, name, e)

    async def destroy_group(self, name: str, *, abort: bool = False) -> None:
        """Destroy the group's process group (``abort``: skip the graceful shutdown). ``"world"`` is refused."""
        pg = self._take_down(name)
        if pg is not None:
            self._guarded("aborting" if abort else "destroying", name, _abort if abort else dist.destroy_process_group,
                          pg)

    async def destroy_groups(self, names: Sequence[str], *, abort: bool = False) -> dict[str, Exception]:
        """Destroy the groups with their NCCL shutdowns overlapped: ``ProcessGroup.shutdown()`` of every group at once
        from a thread pool (each waits for its communicator's proxy poll, [Note: the proxy's 500 ms poll] in
        sim.presets, unless the proxy waker ends it), then torch's bookkeeping (``dist.destroy_process_group``) one
        by one, so the waits overlap instead of adding up (docs/comm.md has the figures). ``abort`` (the failure path)
        aborts them one by one, as :meth:`destroy_group` does. Errors per group, as
        :meth:`Runtime.destroy_groups <refimpl.runtime.base.Runtime.destroy_groups>`.
        """
        if abort or len(names) < 2:
            return await super().destroy_groups(names, abort=abort)
        errors: dict[str, Exception] = {}
        pgs: list[tuple[str, Any]] = []
        for name in names:
            try:
                pg = self._take_down(name)
            except Exception as exc:  # noqa: BLE001 - the others are destroyed all the same
                errors[name] = exc
                continue
            if pg is not None:
                pgs.append((name, pg))
        if pgs:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(pgs), thread_name_prefix="destroy") as pool:
                list(pool.map(lambda item: self._guarded("shutting down", item[0], type(item[1]).shutdown, item[1]),
                              pgs))
        for name, pg in pgs:
            self._guarded("destroying", name, dist.destroy_process_group, pg)
        return errors

    async def recreate_group(self, name: str) -> GroupSpec:
        """Rebuild a destroyed group with its original arguments under the next generation."""
        g = self._entry(name)
        if g.live:
            raise GroupError(f"group {name!r} is live; destroy_group({name!r}) before recreating it")
        spec = replace(g.spec, generation=g.spec.generation + 1)
        # the generation is used up even if creation fails, so every rank's next
        # attempt uses the same (fresh) generation, as in the simulator
        g.spec = spec
        old_torch_name = g.torch_name
        pg, store = self._create_checked(spec, self._adopted.create_kwargs(name))
        self._groups[name] = _Group(spec, pg, torch_name=self._pg_name(pg), store=store)
        self._adopted.rebuilt(name, pg)
        for hook in tuple(self._rebuilt_hooks):
            hook(name, old_torch_name, pg)
        return spec

    def on_rebuilt(self, fn: Callable[[str, str, Any], None]) -> Callable[[], None]:
        """Call ``fn(name, old_torch_name, new_process_group)`` after each rebuild of a group (on the rebuilding
        thread; after an adopted group's references were re-pointed; ``new_process_group`` is None on a
        non-member). Returns a function that removes the hook. Whoever built objects on a group the runtime made
        points them at the rebuilt one from here (:mod:`refimpl.torch_runtime.mesh_groups` for a mesh)."""
        self._rebuilt_hooks.append(fn)

        def remove() -> None:
            if fn in self._rebuilt_hooks:
                self._rebuilt_hooks.remove(fn)

        return remove

    def process_group(self, name: str) -> Any:
        """The live ``torch.distributed`` process group of group ``name`` on this rank (None on a non-member or
        without ``torch.distributed``); a destroyed group raises :class:`GroupError`."""
        g = self._entry(name)
        if not g.live:
            raise GroupError(f"group {name!r} is destroyed; recreate_group({name!r}) first")
        return g.pg

    def live_process_groups(self) -> list[dict[str, Any]]:
        """Every process group alive in this process (torch's registry, the default group included), with the
        runtime's name for it, its backend, ranks, collectives issued, whether an NCCL communicator exists and
        its bytes by ``ncclCommMemStats`` (see :func:`refimpl.torch_runtime.group_census.live_groups`)."""
        from refimpl.torch_runtime.group_census import live_groups

        names = {g.torch_name: n for n, g in self._groups.items() if g.live and g.torch_name}
        return [row.as_dict() for row in live_groups(names)]

    def foreign_group_spec(self, name: str, handle: Any) -> GroupSpec:
        """The spec (ranks, backend, timeout as created) of a ``torch.distributed`` process group made outside
        this runtime, under ``name``."""
        return foreign_spec(name, handle)[0]

    async def adopt_group(self, spec: GroupSpec, handle: Any) -> None:
        """Register a group a framework created (``handle``: its ``ProcessGroup`` on members, None elsewhere) as
        ``spec.name``; a rebuild re-creates it with the arguments it was made with and points every Python
        reference to the old object at the new one ([Note: rebuilt in place] in
        :mod:`refimpl.torch_runtime.foreign_groups`)."""
        if spec.name in self._groups:
            raise GroupError(f"group {spec.name!r} already exists; adopt a framework's group under a new name")
        spec = self._adopted.adopt(self.rank, spec, handle)
        self._groups[spec.name] = _Group(spec, handle, torch_name=self._pg_name(handle))

    def foreign_group_ranks(self, handle: Any) -> tuple[int, ...]:
        """The global ranks of a ``torch.distributed`` process group made outside this runtime, sorted."""
        return tuple(sorted(dist.get_process_group_ranks(handle)))

    def group_spec(self, name: str) -> GroupSpec:
        """The spec of a known group, live or destroyed."""
        return self._entry(name).spec

    def group_live(self, name: str) -> bool:
        """True if the group exists and is not destroyed."""
        g = self._groups.get(name)
        return g is not None and g.live

    def group_names(self) -> list[str]:
        """Every group name this runtime knows."""
        return list(self._groups)

    def _entry(self, name: str) -> _Group:
        try:
            return self._groups[name]
        except KeyError:
            raise GroupError(f"unknown group {name!r}; known: {sorted(self._groups)}; call new_group first") from None

    # ------------------------------------------------------------------ suspend / resume

    def _nccl_group(self, name: str, action: str) -> _Group:
        g = self._entry(name)
        if not g.live:
            raise GroupError(f"cannot {action} group {name!r}: it is destroyed")
        if self._distributed and g.pg is not None and dist.get_backend(g.pg) != "nccl":
            raise GroupError(
                f"cannot {action} group {name!r}: its backend is {dist.get_backend(g.pg)!r}; only NCCL "
                f"communicators can be suspended"
            )
        if not self._distributed:
            raise GroupError(f"cannot {action} group {name!r}: torch.distributed is not initialised, "
                             f"so there is no communicator")
        return g

    async def suspend_group(self, name: str) -> None:
        """Release the communicator's GPU memory (``ncclCommSuspend``); collectives raise until resumed."""
        g = self._nccl_group(name, "suspend")
        if g.suspended:
            raise GroupError(f"group {name!r} is already suspended")
        if g.pg is not None:
            import refimpl.torch_runtime.nccl as nccl

            g.handles = nccl.pg_comm_handles(g.pg, create_lazy=True)
            nccl.suspend_comms(g.handles)
        g.suspended = True

    async def resume_group(self, name: str) -> None:
        """Re-allocate a suspended communicator's memory (``ncclCommResume``)."""
        g = self._nccl_group(name, "resume")
        if not g.suspended:
            raise GroupError(f"group {name!r} is not suspended")
        if g.pg is not None:
            import refimpl.torch_runtime.nccl as nccl

            nccl.resume_comms(g.handles)
        g.suspended = False

    def group_suspended(self, name: str) -> bool:
        """True while the group's communicator is suspended."""
        return self._entry(name).suspended

    def comm_memory(self, name: str) -> CommMemory:
        """Sum of ``ncclCommMemStats`` over the group's communicators on this rank (0 for Gloo)."""
        g = self._entry(name)
        if not (self._distributed and g.live and g.pg is not None) or dist.get_backend(g.pg) != "nccl":
            return CommMemory()
        import refimpl.torch_runtime.nccl as nccl

        handles = g.handles or nccl.pg_comm_handles(g.pg, create_lazy=False)
        stats = [nccl.comm_mem_stats(h) for h in handles]
        return CommMemory(sum(s.suspendable for s in stats), sum(s.persistent for s in stats))

    # ------------------------------------------------------------------ collectives

    def _member_pg(self, name: str, timeout_s: float | None) -> tuple[_Group, Any]:
        """The group for a collective, after the checks that must precede touching the communicator."""
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"collective on {name!r}: timeout_s must be > 0 seconds or None, got {timeout_s}")
        g = self._entry(name)
        if not g.live:
            raise GroupError(f"collective on destroyed group {name!r}; recreate_group({name!r}) first")
        if g.suspended:
            raise GroupSuspendedError(f"collective on suspended group {name!r}; resume_group({name!r}) first")
        if self.rank not in g.spec.ranks:
            raise GroupError(f"rank {self.rank} is not a member of group {name!r} {g.spec.ranks}")
        return g, g.pg

    def _run(self, what: str, name: str, issue: Callable[[], Any], timeout_s: float | None) -> None:
        try:
            work = issue()
            if work is not None:
                ok = work.wait() if timeout_s is None else work.wait(timeout=timedelta(seconds=timeout_s))
                if ok is False:
                    raise TimeoutError(f"work.wait returned False after {timeout_s}s")
        except (GroupError, ValueError):
            raise
        except Exception as e:  # noqa: BLE001 - every backend failure is classified
            if _is_timeout(e):
                limit = timeout_s if timeout_s is not None else self._entry(name).spec.timeout_s
                raise CollectiveTimeoutError(
                    f"{what} on group {name!r} did not complete within {limit:g} s: {e}. A peer is slow, "
                    f"hung or gone; the group should be torn down."
                ) from e
            raise CollectiveFailedError(f"{what} on group {name!r} failed: {e}") from e

    async def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """``output`` receives every member's ``input`` in group-rank order."""
        g, pg = self._member_pg(group, timeout_s)
        if output.dtype != input.dtype or output.numel() != g.spec.size * input.numel():
            raise ValueError(
                f"all_gather_into_tensor on {group!r}: output must be {g.spec.size} x {input.numel()} "
                f"{input.dtype} elements, got {output.numel()} {output.dtype}"
            )
        if not output.is_contiguous():
            raise ValueError("all_gather_into_tensor: output must be contiguous (it is written through a view)")
        out, inp = output.view(-1), input.reshape(-1)
        if pg is None:
            out.copy_(inp)
            return

        # torch >= 2.13 renames all_gather_into_tensor to all_gather_single (the old name warns)
        gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def issue() -> Any:
            try:
                return gather_single(out, inp, group=pg, async_op=True)
            except (RuntimeError, NotImplementedError) as e:
                if "support" not in str(e).lower():
                    raise
                return dist.all_gather(list(out.chunk(g.spec.size)), inp, group=pg, async_op=True)

        self._run("all_gather_into_tensor", group, issue, timeout_s)

    async def all_reduce(
        self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """Reduce ``tensor`` in place across the group (SUM, MIN or MAX)."""
        _, pg = self._member_pg(group, timeout_s)
        if pg is None:
            return
        self._run(f"all_reduce({op.name})", group,
                  lambda: dist.all_reduce(tensor, op=_TORCH_OPS[op], group=pg, async_op=True), timeout_s)

    async def broadcast(
        self, tensor: torch.Tensor, src: int, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """Copy global rank ``src``'s ``tensor`` to every member."""
        g, pg = self._member_pg(group, timeout_s)
        if src not in g.spec.ranks:
            raise GroupError(f"broadcast source rank {src} is not a member of group {group!r} {g.spec.ranks}")
        if pg is None:
            return
        self._run("broadcast", group, lambda: dist.broadcast(tensor, src=src, group=pg, async_op=True), timeout_s)

    async def barrier(self, group: str = WORLD, *, timeout_s: float | None = None) -> None:
        """Return once every member has entered."""
        _, pg = self._member_pg(group, timeout_s)
        if pg is None:
            return
        if dist.get_backend(pg) == "nccl":
            # an all-reduce on this device, instead of barrier()'s guess of the device
            token = torch.zeros(1, device=self.device)
            self._run("barrier", group, lambda: dist.all_reduce(token, group=pg, async_op=True), timeout_s)
            # work.wait() only makes the stream wait; the host returns once every member's token arrived
            self.settle_device()
            return
        self._run("barrier", group, lambda: dist.barrier(group=pg, async_op=True), timeout_s)

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` of wall time."""
        if seconds < 0:
            raise ValueError(f"sleep: seconds must be >= 0, got {seconds}")
        time.sleep(seconds)


def _default_store() -> Any:
    """The store ``init_process_group`` set up (votes and arrival marks live there); None if there is none."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no default group (destroyed), or a torch without the helper
        return None


def _abort(pg: Any) -> None:
    """Abort a process group without the graceful shutdown, then forget it."""
    abort_pg = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort_pg is not None:
        abort_pg(pg)
        return
    if hasattr(pg, "abort"):
        pg.abort()
    dist.destroy_process_group(pg)


def _address_in_use(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
            return True
        if "address already in use" in str(e).lower() or "eaddrinuse" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def _is_timeout(e: BaseException) -> bool:
    if isinstance(e, TimeoutError):
        return True
    text = str(e).lower()
    return "timed out" in text or "timeout" in text


__all__ = ["TorchRuntime"]
