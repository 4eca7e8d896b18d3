"""Issue 14's misuse suite: random sequences of attach, offload, reload, mutation, failure injection and
thread interleavings on one store; after every step every tensor's bytes are recoverable and equal to
what the model expects.

The store runs on a real CPU ``TorchRuntime`` whose copies and protocol points can be made to fail (a
copy that ran but reports an error when awaited, as a CUDA error surfaces; an exception at a named
point). The model is a snapshot of every attached tensor's values, taken whenever the test changes them
on the device: offload, reload and their failures must never change what the snapshot says.
"""
import threading

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from refimpl.torch_runtime import TorchRuntime
from refimpl.runtime.base import Completion, CopyKind
from refimpl.store import (Category, OffloadedTensorError, OffloadStore, StoreConfig, StoreError, TensorChangedError,
                           is_parked)


class InjectedFault(RuntimeError):
    """A failure the test injected."""


class _Failed(Completion):
    def __init__(self, what):
        self.what = what

    def done(self):
        return False

    def __await__(self):
        raise InjectedFault(self.what)
        yield  # pragma: no cover


class FaultyRuntime(TorchRuntime):
    """A CPU TorchRuntime with one-shot faults: the n-th D2H or H2D copy fails, or a named point raises."""

    def __init__(self):
        super().__init__("cpu")
        self.copy_fault: tuple[CopyKind, int] | None = None
        self.point_fault: str | None = None
        self.fired = False

    def copy_async(self, dst, src, kind):
        done = super().copy_async(dst, src, kind)
        if self.copy_fault is not None and self.copy_fault[0] is kind:
            kind_, n = self.copy_fault
            if n <= 1:
                self.copy_fault, self.fired = None, True
                return _Failed(f"{kind.value} copy")
            self.copy_fault = (kind_, n - 1)
        return done

    async def point(self, name):
        if self.point_fault == name:
            self.point_fault, self.fired = None, True
            raise InjectedFault(f"at {name}")


SIZES = st.integers(1, 300)


class StoreMisuse(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.rt = FaultyRuntime()
        cfg = StoreConfig(pack_below_bytes=256, staging_bytes=1024, segment_bytes=2048, alignment_bytes=64,
                          pin_ahead="off")
        self.store = OffloadStore(self.rt, config=cfg)
        self.tensors: dict[str, torch.Tensor] = {}
        self.expected: dict[str, torch.Tensor] = {}
        self.sources = 0
        self.offloaded = False

    # ---- helpers

    def _snapshot(self):
        self.expected = {k: t.detach().clone() for k, t in self.tensors.items()}

    def _disarm(self):
        self.rt.copy_fault = self.rt.point_fault = None
        self.rt.fired = False

    # ---- rules

    @precondition(lambda self: not self.store.stats().offloaded and self.sources < 4)
    @rule(sizes=st.lists(SIZES, min_size=1, max_size=3), view=st.booleans(), category=st.sampled_from(
        ["params", "optimizer"]))
    def attach(self, sizes, view, category):
        name = f"s{self.sources}"
        self.sources += 1
        group = {f"t{i}": torch.randn(n) for i, n in enumerate(sizes)}
        if view:  # a second registered tensor viewing the first one's storage
            group["view"] = group["t0"][: max(1, sizes[0] // 2)]
        self.store.attach_tensors(category, group, name=name)
        self.tensors.update({f"{name}.{k}": t for k, t in group.items()})
        self._snapshot()

    @rule()
    def offload(self):
        self.store.offload()
        self.offloaded = bool(self.tensors) or self.offloaded

    @rule()
    def reload(self):
        self.store.reload()
        self.offloaded = False

    @precondition(lambda self: not self.offloaded and self.tensors)
    @rule(data=st.data())
    def mutate(self, data):
        name = data.draw(st.sampled_from(sorted(self.tensors)))
        with torch.no_grad():
            self.tensors[name].mul_(-1).add_(1)
        self._snapshot()

    @precondition(lambda self: self.offloaded)
    @rule(data=st.data())
    def touch_while_offloaded(self, data):
        name = data.draw(st.sampled_from(sorted(self.tensors)))
        t = self.tensors[name]
        assert is_parked(t)
        assert "offloaded" in repr(t) and t.shape == self.expected[name].shape  # never a crash, never NaN
        for use in (t.sum, lambda: t.add_(1)):  # every read and write raises, one-element tensors too
            with pytest.raises(OffloadedTensorError, match=rf"{name} is offloaded.*reload\(\) first"), torch.no_grad():
                use()

    @precondition(lambda self: self.offloaded)
    @rule(data=st.data())
    def reassign_then_recover(self, data):
        name = data.draw(st.sampled_from(sorted(self.tensors)))
        self.tensors[name].data = torch.zeros(3)
        try:
            self.store.reload()
        except TensorChangedError as e:
            assert name in str(e) and "recover()" in str(e)
        else:
            raise AssertionError("a re-assigned tensor was reloaded over without a TensorChangedError")
        assert self.store.is_offloaded("params") or self.store.is_offloaded("optimizer"), "still offloaded"
        changed = self.store.recover()
        assert any(name in c for c in changed)
        self.offloaded = False

    @precondition(lambda self: not self.offloaded and self.tensors)
    @rule(kind=st.sampled_from(["copy", "store.offload.begin", "store.offload.wait", "store.offload.release"]),
          n=st.integers(1, 6))
    def failing_offload(self, kind, n):
        if kind == "copy":
            self.rt.copy_fault = (CopyKind.D2H, n)
        else:
            self.rt.point_fault = kind
        try:
            self.store.offload()
        except InjectedFault:
            assert self.rt.fired
            assert not any(is_parked(t) for t in self.tensors.values()), "a failed offload leaves nothing parked"
        else:
            self.offloaded = True  # fewer copies than n: it went through
        self._disarm()

    @precondition(lambda self: self.offloaded)
    @rule(kind=st.sampled_from(["copy", "store.reload.begin", "store.reload.wait"]), n=st.integers(1, 4))
    def failing_reload(self, kind, n):
        if kind == "copy":
            self.rt.copy_fault = (CopyKind.H2D, n)
        else:
            self.rt.point_fault = kind
        try:
            self.store.reload()
        except InjectedFault:
            assert all(is_parked(t) for t in self.tensors.values()), "a failed reload keeps the state offloaded"
        else:
            self.offloaded = False
        self._disarm()

    @rule(rounds=st.integers(1, 3))
    def two_threads(self, rounds):
        errors = []

        def work():
            try:
                for _ in range(rounds):
                    self.store.offload()
                    self.store.reload()
            except BaseException as e:  # noqa: BLE001 - asserted below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        self.offloaded = False  # whatever the interleaving, some thread's reload runs last

    # ---- the invariant

    @invariant()
    def every_byte_is_recoverable(self):
        assert self.store.in_progress is None
        if not self.offloaded:
            for name, t in self.tensors.items():
                assert not is_parked(t), f"{name} is parked while the model says it is on the device"
                assert torch.equal(t, self.expected[name]), f"{name} changed"
            return
        host = self.store.host_tensors()
        for name, want in self.expected.items():
            assert is_parked(self.tensors[name]), name
            assert torch.equal(host[name], want), f"{name}: the host copy differs"


StoreMisuse.TestCase.settings = settings(
    max_examples=30, stateful_step_count=12, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestStoreMisuse = StoreMisuse.TestCase


def test_store_errors_are_store_errors():
    """The errors the machine expects are the store's own (a sanity check of the imports above)."""
    assert issubclass(TensorChangedError, StoreError) and Category.parse("params") is Category.PARAMS
