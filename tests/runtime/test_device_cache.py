"""TorchRuntime's device-cache modes and point hooks, and the default switch policy, without a GPU."""
from __future__ import annotations

import pytest


def test_device_cache_modes_are_checked_and_empty_cache_is_harmless_on_cpu(monkeypatch):
    from refimpl.torch_runtime import TorchRuntime

    for mode in ("shared", "private", "keep"):
        rt = TorchRuntime("cpu", device_cache=mode)
        t = rt.alloc_device(8, __import__("torch").float32, tag="store.flat.params")
        rt.empty_cache()
        assert rt.device_cache.mode == mode and t.numel() == 8 and rt.device_cache.pool_bytes() == 0
    with pytest.raises(ValueError, match="TIMESHARE_DEVICE_CACHE"):
        TorchRuntime("cpu", device_cache="all")
    monkeypatch.setenv("TIMESHARE_DEVICE_CACHE", "keep")
    assert TorchRuntime("cpu").device_cache.mode == "keep"


def test_point_hooks_run_where_protocol_code_reaches_them_and_can_be_removed():
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime("cpu")
    seen = []
    remove = rt.on_point("store.reload.wait", lambda: seen.append(1))
    rt.run(rt.point("store.reload.wait"))
    rt.run(rt.point("store.offload.wait"))
    remove()
    rt.run(rt.point("store.reload.wait"))
    assert seen == [1]


def test_the_default_switch_policy_without_nccl_is_destroy_deferred():
    from refimpl.comm import PGPolicy
    from refimpl.torch_runtime.switch_policy import default_switch_policy

    choice = default_switch_policy("cpu")
    assert choice.policy is PGPolicy.DESTROY_DEFERRED and not choice.parallel_destroy and "cpu" in choice.reason
