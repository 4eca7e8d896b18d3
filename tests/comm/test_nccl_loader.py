"""Finding the NCCL library loaded in this process (maps parsing, version codes, opening without loading)."""
from __future__ import annotations

import ctypes
import re

import pytest

from refimpl.torch_runtime import nccl
from refimpl.torch_runtime.nccl_loader import (
    NcclNotLoadedError,
    _read_maps,
    decode_version,
    find_loaded_nccl,
    format_version,
    mapped_libraries,
    open_loaded,
    owner_of,
    parse_maps,
)

MAPS = """\
55d0a0000000-55d0a0001000 r--p 00000000 fe:00 1 /usr/bin/python3.12
7f00000000-7f00100000 r-xp 00000000 fe:00 2 /opt/nccl-2.32.3/lib/libnccl.so.2.32.3
7f00100000-7f00200000 r--p 00100000 fe:00 2 /opt/nccl-2.32.3/lib/libnccl.so.2.32.3
7f10000000-7f10100000 r-xp 00000000 fe:00 3 /venv/site-packages/nvidia/nccl/lib/libnccl.so.2
7f20000000-7f20001000 r-xp 00000000 fe:00 4 /venv/site-packages/nvidia/nccl/lib/libnccl-net.so
7f30000000-7f30001000 rw-p 00000000 00:00 0 [heap]
7f40000000-7f40001000 r-xp 00000000 fe:00 5 /tmp/libnccl.so.2 (deleted)
"""


def test_maps_parsing_finds_every_mapped_libnccl_once_and_not_its_plugins():
    regions = parse_maps(MAPS)
    assert [r.path for r in regions][-1] == "/tmp/libnccl.so.2"
    assert mapped_libraries(regions) == [
        "/opt/nccl-2.32.3/lib/libnccl.so.2.32.3",
        "/venv/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "/tmp/libnccl.so.2",
    ]
    assert owner_of(0x7F00150000, regions) == "/opt/nccl-2.32.3/lib/libnccl.so.2.32.3"
    assert owner_of(0x7F30000000, regions) is None


@pytest.mark.parametrize("code, version", [(22907, (2, 29, 7)), (23203, (2, 32, 3)), (22809, (2, 28, 9)), (2708, (2, 7, 8))])
def test_version_codes_decode_as_nccl_encodes_them(code, version):
    assert decode_version(code) == version
    assert format_version(version) == ".".join(map(str, version))


def test_version_zero_is_not_a_version():
    with pytest.raises(ValueError):
        decode_version(0)


def test_opening_a_mapped_library_reuses_the_loaded_copy():
    libc = [p for p in mapped_libraries(_read_maps(), re.compile(r"/libc\.so\.6$"))]
    assert libc, "this process maps libc"
    lib = open_loaded(libc[0])
    strlen = lib.strlen
    strlen.restype, strlen.argtypes = ctypes.c_size_t, [ctypes.c_char_p]
    assert strlen(b"nccl") == 4
    with pytest.raises(OSError):
        ctypes.CDLL("/nonexistent/libnccl.so.2", mode=__import__("os").RTLD_NOLOAD | __import__("os").RTLD_LAZY)


def test_a_library_without_ncclGetVersion_is_not_nccl():
    libc = mapped_libraries(_read_maps(), re.compile(r"/libc\.so\.6$"))[0]
    with pytest.raises(NcclNotLoadedError, match="has no ncclGetVersion"):
        nccl.NcclLibrary(libc, open_loaded(libc))


def test_without_nccl_in_the_process_loading_says_so():
    if mapped_libraries(_read_maps()):
        pytest.skip("an NCCL library is loaded in this process")
    with pytest.raises(NcclNotLoadedError, match="no NCCL library is loaded in this process"):
        find_loaded_nccl()


def test_dedupe_keeps_order_and_drops_null_handles():
    assert nccl.dedupe([0x10, 0, 0x20, 0x10, 0x30, 0x20]) == [0x10, 0x20, 0x30]


def test_comm_mem_report_consistency():
    assert nccl.CommMemReport(384, False, 4, 388).consistent
    assert not nccl.CommMemReport(384, False, 4, 1000).consistent


def test_mem_stat_enum_matches_nccl_h():
    # nccl.h (2.29.7+): ncclStatGpuMemSuspend=0, Suspended=1, Persist=2, Total=3; NCCL_SUSPEND_MEM=0x01
    assert [int(s) for s in nccl.CommMemStat] == [0, 1, 2, 3]
    assert nccl.CommMemStat.GPU_MEM_PERSIST == 2 and nccl.NCCL_SUSPEND_MEM == 1
