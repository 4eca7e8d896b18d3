"""``--profile``: ``torch.profiler`` over chosen stretches of the colocated RL step."""
from __future__ import annotations

import os
from typing import Any


class StretchProfiler:
    """``torch.profiler`` over a stretch of the run (rank 0), written as ``profile_<name>.json`` (a Chrome trace)
    and ``profile_<name>.txt`` (the ops by device time) into ``out``; a no-op when ``on`` is false."""

    def __init__(self, on: bool, out: str, cuda: bool) -> None:
        self.on, self.out, self.cuda = on, out, cuda
        self._prof: Any = None
        self._name = ""

    def start(self, name: str) -> None:
        """Start profiling the stretch ``name``."""
        if not self.on:
            return
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof, self._name = profile(activities=acts), name
        self._prof.__enter__()

    def stop(self) -> None:
        """Stop and write the stretch's trace and table."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        os.makedirs(self.out, exist_ok=True)
        prof.export_chrome_trace(os.path.join(self.out, f"profile_{self._name}.json"))
        with open(os.path.join(self.out, f"profile_{self._name}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total" if self.cuda else "cpu_time_total",
                                              row_limit=40))


__all__ = ["StretchProfiler"]
