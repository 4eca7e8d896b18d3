"""Join and decompress the carried NCCL parts on the GPU machine.

The `nvidia-nccl-cu13` wheel's libnccl.so.2 (344 MB) is too large for one call's
working tree, so it travels zstd-compressed in 56 MiB parts (`.nccl/pNN`), one per
call, copied to /root/ncclparts/ there. This joins them and writes
/root/ncclparts/libnccl.so.2 (needs the carried `zstandard` wheel on PYTHONPATH).

    python3 bench/gpu/nccl_assemble.py [/root/ncclparts]
"""
import hashlib
import pathlib
import sys

import zstandard

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/root/ncclparts")
target = folder / "libnccl.so.2"
if target.exists():
    print(f"{target} already there")
    sys.exit(0)
parts = sorted(folder.glob("p[0-9][0-9]"))
if not parts:
    sys.exit(f"no parts in {folder}")
blob = b"".join(p.read_bytes() for p in parts)
data = zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 30)
target.write_bytes(data)
print(f"{target}: {len(data)} bytes from {len(parts)} parts, sha256 {hashlib.sha256(data).hexdigest()[:16]}")
