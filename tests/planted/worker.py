"""Planted breaks in the Ray roles (``refimpl/worker``) and the DCP checkpoints' metadata checks.

Each one undoes one guard against a silent wrong answer: a failed call nobody read, a bounded ``get``, the
order of explicit moves on threaded actors, the ranks' one state after an interrupted offload, the checksum
of a checkpoint's metadata and the coverage of a load plan.
"""
from __future__ import annotations

from tests.planted import Break as B

RAY = "tests/worker/test_ray_failures.py"
DCP = "tests/runtime/test_dcp_metadata.py"

WORKER_BREAKS: tuple[B, ...] = (
    B("dropped_call_failure_forgotten", "refimpl/worker/cluster.py",
      "            if ok:\n                continue\n", "            if True:\n                continue\n",
      (f"{RAY}::test_a_failed_call_whose_future_was_dropped_is_raised_by_the_next_call",),
      "a call whose future nobody read fails on one rank: the ranks diverge and no later call raises"),
    B("bounded_get_stops_the_role", "refimpl/worker/cluster.py",
      "        if not raised and pending_only:\n", "        if False:\n",
      (f"{RAY}::test_a_bounded_get_that_runs_out_leaves_the_role_alive",),
      "get(timeout_s=...) on a call still running stops the role's actors and loses their state"),
    B("explicit_offload_not_ordered", "refimpl/worker/cluster.py",
      "            after, self._last_move = seq, seq\n", "            after, self._last_move = 0, seq\n",
      (f"{RAY}::test_an_offload_runs_after_the_calls_submitted_before_it_on_every_rank",),
      "on a threaded actor an explicit offload runs before a call sent ahead of it on some ranks: they stay "
      "resident while the others offload"),
    B("split_offload_left_split", "refimpl/worker/cluster.py",
      "        if not offloaded or not resident:\n", "        if True:\n",
      (f"{RAY}::test_an_interrupted_offload_on_one_rank_leaves_every_rank_in_one_state",),
      "an offload interrupted on one rank leaves that rank resident and its peers offloaded"),
    B("metadata_not_verified", "refimpl/torch_runtime/dcp_checksums.py",
      "                verify_metadata(reader, rank)\n", "                pass\n",
      (f"{DCP}::test_every_flipped_bit_of_the_metadata_fails_the_load_on_every_rank_and_changes_nothing",),
      "a load unpickles the checkpoint's metadata without comparing it with the CRC-32 written at save"),
    B("load_plan_coverage_unchecked", "refimpl/torch_runtime/dcp_coverage.py",
      "        check_coverage(plan.items, self.state_dict)\n", "",
      (f"{DCP}::test_metadata_that_leaves_part_of_a_shard_unread_fails_the_load_on_every_rank",),
      "a load whose metadata leaves part of a shard unread fills it with the staging copy's uninitialised memory"),
)
