"""Benchmarks behind ``timeshare bench``: each prints ratios against baselines measured in the same run.

* :mod:`refimpl.benchmarks.offload`: the offload store vs per-tensor copies, fresh pinning,
  torch_memory_saver and the PCIe line rate (shapes in :mod:`refimpl.benchmarks.shapes`,
  methods in :mod:`refimpl.benchmarks.baselines`).
* :mod:`refimpl.benchmarks.switch_window`: process-group policies in the actor/rollout switch.
"""
