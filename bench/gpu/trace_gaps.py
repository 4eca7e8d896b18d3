"""Where a profiled step's device time went: busy time per stream, the compute stream's idle gaps, host waits.

    python3 bench/gpu/trace_gaps.py profile_switch_tail_2.json [profile_train_plain_4.json ...] [--gaps 12]

Reads Chrome traces written by ``torch.profiler`` (``bench/gpu/rl_step.py --profile``; ``.json`` or
``.json.gz``) and prints, per trace: the trace's span; per CUDA stream the number of kernels, copies and
memsets and their busy time; the stream with the most kernel time (the compute stream) with its idle time
and its longest gaps (what ran before and after each, and for the work after it when the host launched it and
under which of its ops: work launched long before it ran was queued behind something, such as a pinned copy behind
another stream's copies on the copy engine); and the CUDA runtime calls the host spent most time
in (``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaMemcpyAsync`` from pageable memory ...).
Two traces of the same step, one after a switch and one plain, side by side say what the switch left behind.
"""
from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from typing import Any

DEVICE_CATS = {"kernel": "kernels", "gpu_memcpy": "copies", "gpu_memset": "memsets"}


def load(path: str) -> list[dict[str, Any]]:
    """The trace's complete events (``ph == "X"``)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def analyse(events: list[dict[str, Any]], n_gaps: int = 12) -> dict[str, Any]:
    """The figures :func:`report` prints (times in ms)."""
    dev = [e for e in events if e.get("cat") in DEVICE_CATS]
    if not events:
        return {"span_ms": 0.0, "streams": {}, "gaps": [], "runtime": []}
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    streams: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_stream: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in dev:
        sid = e.get("args", {}).get("stream", e.get("tid"))
        kind = DEVICE_CATS[e["cat"]]
        streams[sid][kind] += 1
        streams[sid][f"{kind}_ms"] += e["dur"] / 1e3
        by_stream[sid].append(e)
    compute = max(streams, key=lambda s: streams[s]["kernels_ms"]) if streams else None
    gaps = []
    idle = 0.0
    if compute is not None:
        evs = sorted(by_stream[compute], key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            gap = b["ts"] - (a["ts"] + a["dur"])
            if gap > 0:
                idle += gap
                gaps.append({"at_ms": (a["ts"] + a["dur"] - t0) / 1e3, "gap_ms": gap / 1e3,
                             "before": a.get("name", "")[:60], "after": b.get("name", "")[:60], "_next": b})
        gaps.sort(key=lambda g: -g["gap_ms"])
        gaps = gaps[:n_gaps]
        launches = _launches(events)
        for g in gaps:
            g.update(launches(g.pop("_next"), t0))
    runtime: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            r = runtime[e.get("name", "")]
            r[0] += 1
            r[1] += e["dur"] / 1e3
    top = sorted(((k, int(v[0]), v[1]) for k, v in runtime.items()), key=lambda x: -x[2])[:10]
    span = (t1 - t0) / 1e3
    dspan = 0.0
    if compute is not None and by_stream[compute]:
        evs = by_stream[compute]
        dspan = (max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)) / 1e3
    return {"span_ms": span, "compute_stream": compute, "compute_span_ms": dspan, "compute_idle_ms": idle / 1e3,
            "streams": {str(k): dict(v) for k, v in streams.items()}, "gaps": gaps[:n_gaps], "runtime": top}


def _launches(events: list[dict[str, Any]]):
    """A function giving, for a device event, when the host launched it (``launched_ms``, from the trace's start)
    and the host ops it was launched under (``launched_in``: the innermost annotations and ops, outermost first),
    matched by the profiler's correlation id; empty where the trace has no such launch."""
    runtime = {e.get("args", {}).get("correlation"): e for e in events
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation") is not None}
    host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]

    def of(dev: dict[str, Any], t0: float) -> dict[str, Any]:
        r = runtime.get(dev.get("args", {}).get("correlation"))
        if r is None:
            return {}
        around = sorted((e for e in host if e.get("tid") == r.get("tid") and e["ts"] <= r["ts"] <= e["ts"] + e["dur"]),
                        key=lambda e: e["ts"])
        return {"launched_ms": (r["ts"] - t0) / 1e3, "launched_in": [e.get("name", "")[:60] for e in around[-6:]]}

    return of


def report(path: str, a: dict[str, Any]) -> str:
    """A few lines of text for one trace."""
    lines = [f"== {path}: span {a['span_ms']:.1f} ms; compute stream {a.get('compute_stream')}: "
             f"first kernel to last {a.get('compute_span_ms', 0):.1f} ms, idle between {a.get('compute_idle_ms', 0):.1f} ms"]
    for sid, v in sorted(a["streams"].items(), key=lambda kv: -(kv[1].get("kernels_ms", 0) + kv[1].get("copies_ms", 0))):
        lines.append(f"  stream {sid:>6}: kernels {int(v.get('kernels', 0)):5d} {v.get('kernels_ms', 0):8.2f} ms  "
                     f"copies {int(v.get('copies', 0)):4d} {v.get('copies_ms', 0):8.2f} ms  "
                     f"memsets {int(v.get('memsets', 0)):3d} {v.get('memsets_ms', 0):6.2f} ms")
    lines.append("  longest idle gaps of the compute stream (at ms from the trace's start):")
    for g in a["gaps"]:
        lines.append(f"    {g['gap_ms']:7.2f} ms at {g['at_ms']:8.2f}: after {g['before']!r} before {g['after']!r}")
        if "launched_ms" in g:
            lines.append(f"      (launched at {g['launched_ms']:.2f} ms, under: {' > '.join(g['launched_in'])})")
    lines.append("  host time in CUDA runtime calls:")
    for name, n, ms in a["runtime"]:
        lines.append(f"    {ms:8.2f} ms  {n:6d} x {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one report per trace given."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--gaps", type=int, default=12, help="how many of the longest gaps to list")
    a = ap.parse_args(argv)
    for p in a.traces:
        print(report(p, analyse(load(p), a.gaps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
