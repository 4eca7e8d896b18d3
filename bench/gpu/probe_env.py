"""Probe the GPU machine's environment: versions and the APIs this project relies on."""
import ctypes, os, subprocess, sys, time
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl(built)", torch.cuda.nccl.version())
print("device", torch.cuda.get_device_name(0), "mem_get_info", torch.cuda.mem_get_info())
cr = torch.cuda.cudart()
print("cudart has cudaHostRegister:", hasattr(cr, "cudaHostRegister"), "cudaHostUnregister:", hasattr(cr, "cudaHostUnregister"))
t = torch.empty(1 << 28, dtype=torch.uint8)
t0 = time.perf_counter(); rc = cr.cudaHostRegister(t.data_ptr(), t.numel(), 0); dt = time.perf_counter() - t0
print("cudaHostRegister 256MiB rc", rc, "is_pinned", t.is_pinned(), f"{dt:.4f}s")
import torch.distributed as dist
pg_cls = getattr(dist, "ProcessGroupNCCL", None)
print("ProcessGroupNCCL._comm_ptr:", hasattr(pg_cls, "_comm_ptr") if pg_cls else None)
try:
    from torch.distributed.fsdp import fully_shard
    print("fully_shard ok")
except Exception as e:
    print("fully_shard import failed", e)
print([l.split()[-1] for l in open("/proc/self/maps") if "nccl" in l][:3])
for mod in ("torch_memory_saver", "zstandard", "matplotlib", "numpy", "networkx", "hypothesis", "xdist"):
    try:
        m = __import__(mod); print(mod, getattr(m, "__version__", "?"))
    except Exception as e:
        print(mod, "MISSING", type(e).__name__, e)
print("zstd cli:", subprocess.run("which zstd unzstd; nproc; free -g | head -2", shell=True, capture_output=True, text=True).stdout)
