"""One local Ray cluster per test module, sized for a 2-core CI machine (the repository on the actors' path)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def start_ray(num_cpus: int = 2):
    """``ray.init`` a local cluster of ``num_cpus`` CPUs; the module skips with a reason when Ray is absent."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpu-timeshare[ray]')")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=num_cpus, num_gpus=0, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    return ray
