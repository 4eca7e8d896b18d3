"""offload_nccl validation: every missing requirement reported with its fix; never silently off."""
from __future__ import annotations

import pytest

from refimpl.torch_runtime.nccl_validation import (
    NcclFacts,
    NcclOffloadUnavailableError,
    nccl_setting,
    offload_nccl_problems,
    parse_nccl_conf,
    require_offload_nccl,
    validate_offload_nccl,
)

GOOD = NcclFacts(version=(2, 32, 3), path="/x/libnccl.so.2", has_suspend_resume=True, has_mem_stats=True)
STOCK = NcclFacts(version=(2, 28, 9), path="/site/nvidia/nccl/lib/libnccl.so.2", has_suspend_resume=False,
                  has_mem_stats=False)


def test_new_enough_nccl_with_default_settings_passes():
    assert offload_nccl_problems(GOOD, {}, conf_files=[]) == []
    assert require_offload_nccl(facts=GOOD, env={}, conf_files=[]) is GOOD
    exact = NcclFacts((2, 29, 7), "/x", True, True)
    assert offload_nccl_problems(exact, {"NCCL_CUMEM_ENABLE": "1", "NCCL_DISABLE_MEM_MANAGER": "0"}, []) == []


def test_stock_nccl_is_refused_naming_version_path_missing_symbols_and_the_fix():
    with pytest.raises(NcclOffloadUnavailableError) as info:
        require_offload_nccl(facts=STOCK, env={}, conf_files=[])
    msg = str(info.value)
    assert "the loaded NCCL is 2.28.9 (/site/nvidia/nccl/lib/libnccl.so.2); suspend/resume needs >= 2.29.7" in msg
    assert "does not export ncclCommSuspend/ncclCommResume" in msg
    assert "does not export ncclCommMemStats" in msg
    assert "LD_PRELOAD" in msg and "set offload_nccl to false" in msg
    assert len(info.value.problems) == 3


def test_a_new_version_without_the_symbols_is_refused():
    odd = NcclFacts((2, 30, 1), "/custom/libnccl.so", has_suspend_resume=False, has_mem_stats=True)
    problems = offload_nccl_problems(odd, {}, [])
    assert [p.what for p in problems] == ["/custom/libnccl.so (NCCL 2.30.1) does not export ncclCommSuspend/ncclCommResume"]


def test_no_library_loaded_is_refused():
    none = NcclFacts(None, None, False, False)
    (p,) = offload_nccl_problems(none, {}, [])
    assert p.what == "no NCCL library is loaded in this process"


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"NCCL_CUMEM_ENABLE": "0"}, "NCCL_CUMEM_ENABLE=0 (from environment)"),
        ({"NCCL_DISABLE_MEM_MANAGER": "1"}, "NCCL_DISABLE_MEM_MANAGER=1 (from environment)"),
    ],
)
def test_cumem_off_or_memory_manager_off_is_refused(env, needle):
    (p,) = offload_nccl_problems(GOOD, env, [])
    assert needle in p.what and "before any NCCL communicator is created" in p.fix


def test_settings_are_read_as_nccl_reads_them_env_then_user_conf_then_system_conf(tmp_path):
    user, system = tmp_path / "user.conf", tmp_path / "nccl.conf"
    user.write_text("# comment\nNCCL_DEBUG=INFO\n")
    system.write_text("NCCL_CUMEM_ENABLE = 0  # off for this cluster\nNCCL_DISABLE_MEM_MANAGER=1\n")
    files = [str(user), str(system)]
    assert nccl_setting("NCCL_CUMEM_ENABLE", {}, files) == ("0", str(system))
    assert nccl_setting("NCCL_CUMEM_ENABLE", {"NCCL_CUMEM_ENABLE": "1"}, files) == ("1", "environment")
    assert nccl_setting("NCCL_NET", {}, files) == (None, "unset")
    whats = [p.what for p in offload_nccl_problems(GOOD, {}, files)]
    assert whats == [
        f"NCCL_CUMEM_ENABLE=0 (from {system}) turns off cuMem allocation, which suspend needs",
        f"NCCL_DISABLE_MEM_MANAGER=1 (from {system}) turns off NCCL's memory manager, which suspend needs",
    ]
    user.write_text("NCCL_CUMEM_ENABLE=1\nNCCL_DISABLE_MEM_MANAGER=0\n")
    assert offload_nccl_problems(GOOD, {}, files) == [], "the user file wins over /etc/nccl.conf"


def test_conf_parsing():
    assert parse_nccl_conf("A=1\n\n# x\nB = two # c\nnot a setting\nA=3\n") == {"A": "1", "B": "two"}


def test_off_means_no_check_and_on_checks_the_real_process():
    assert validate_offload_nccl(False) is None
    facts = NcclFacts.probe()  # this process: a CPU build of torch has no NCCL
    if facts.version is None:
        with pytest.raises(NcclOffloadUnavailableError, match="no NCCL library is loaded"):
            validate_offload_nccl(True, conf_files=[])
