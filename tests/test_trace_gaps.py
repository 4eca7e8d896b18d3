"""bench/gpu/trace_gaps.py on a small Chrome trace in torch.profiler's format: the compute stream's gaps, and for
the work after each, when the host launched it and under which of its ops (what found FSDP2's pinned copy queued
behind a streamed reload on the copy engine)."""
from __future__ import annotations

import gzip
import json

from bench.gpu.trace_gaps import analyse, load, report


def _trace():
    """A reload's copy on stream 25 from 0 to 200 us; the compute stream 7 runs a kernel, then waits for a pinned
    copy launched at 20 us under FSDP2's reduce, which runs only after the reload (at 200 us)."""
    ev = [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 0, "dur": 200,
         "args": {"stream": 25, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 30, "args": {"stream": 7, "correlation": 2}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 200, "dur": 1,
         "args": {"stream": 7, "correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "chunk_cat", "ts": 201, "dur": 5, "args": {"stream": 7, "correlation": 4}},
        {"ph": "X", "cat": "user_annotation", "name": "FSDP::post_backward_reduce (lm_head)", "ts": 15, "dur": 20,
         "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_chunk_cat", "ts": 18, "dur": 10, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 19, "dur": 3, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 20, "dur": 1, "tid": 1,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 40, "dur": 5, "tid": 2},  # another thread: not it
    ]
    return {"traceEvents": ev}


def test_the_longest_gap_names_the_copy_and_where_the_host_launched_it(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_trace(), f)
    a = analyse(load(str(path)), n_gaps=2)
    assert a["compute_stream"] == 7
    g = a["gaps"][0]
    assert g["gap_ms"] == 0.17 and g["after"].startswith("Memcpy HtoD")
    assert g["launched_ms"] == 0.02
    assert g["launched_in"] == ["FSDP::post_backward_reduce (lm_head)", "aten::_chunk_cat", "aten::copy_"]
    text = report("t.json.gz", a)
    assert "launched at 0.02 ms, under: FSDP::post_backward_reduce (lm_head) > aten::_chunk_cat > aten::copy_" in text
