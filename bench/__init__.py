"""Benchmarks, all in one place: the top floor beside the CLI and the demo.

Modules (installed with the package, so ``timeshare bench ...`` works anywhere):

* :mod:`bench.cli`: the ``timeshare bench`` subcommands.
* :mod:`bench.offload`: the offload store vs per-tensor copies, fresh pinning,
  torch_memory_saver and the PCIe line rate (state shapes in
  :mod:`sim.presets.bench_shapes`, methods in :mod:`bench.baselines`).
* :mod:`bench.switch_window`: process-group policies in the actor/rollout switch.

Scripts (run from a checkout, not installed as commands): ``offload_bench.py``,
``switch_window_bench.py``, ``sim_calibration.py``, ``sim_scale_bench.py`` here;
the H200 probes and run scripts under ``gpu/``; recorded runs under ``results/``.
Each benchmark prints ratios against baselines measured in the same run.
"""
