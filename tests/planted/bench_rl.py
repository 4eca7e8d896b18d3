"""Planted breaks of the RL step's switch on several GPUs (bench/rl): the forward served from the rollout's copy."""
from __future__ import annotations

from tests.planted import Break as B

GATHER = "tests/test_rollout_gather.py"
LOOP = "tests/test_rl_loop.py"

BENCH_RL_BREAKS: tuple[B, ...] = (
    B("rollout_fill_ranks_swapped", "bench/rl/rollout_gather.py",
      "    return chunks + [t[:0]] * (world - len(chunks))\n",
      "    return (chunks + [t[:0]] * (world - len(chunks)))[::-1]\n",
      (GATHER,),
      "the all-gather filled from the rollout's copy puts each rank's chunk where another rank's belongs",
      ci_tests=(f"{GATHER}::test_fill_gives_the_bytes_of_fsdp2s_all_gather",)),
    B("rollout_fill_never_disarmed", "bench/rl/rollout_gather.py",
      "            comm.armed = False\n", "            pass\n",
      (f"{LOOP}::test_switch_ngpu_two_ranks_is_bitwise_and_leaves_no_group_in_the_rollout", GATHER),
      "the rollout's copy keeps serving all-gathers after the first training step of a switch, when it no longer "
      "holds the trainer's weights"),
    B("resume_not_joined_before_backward", "bench/rl/modes.py",
      "        self.join_ahead(at=\"backward\")\n", "        pass\n",
      (f"{LOOP}::test_switch_ngpu_two_ranks_is_bitwise_and_leaves_no_group_in_the_rollout",),
      "with the forward served from the rollout's copy the resume ahead is never joined before the backward: the "
      "backward's collectives run on groups the thread is still rebuilding"),
    B("gc_setup_never_frozen", "bench/rl/step.py",
      '    rec["gc_freeze"] = {"on": cfg.gc_freeze, "frozen_objects": freeze_setup() if cfg.gc_freeze else 0}\n',
      '    rec["gc_freeze"] = {"on": cfg.gc_freeze, "frozen_objects": gc.get_freeze_count()}\n',
      (f"{LOOP}::test_rl_step_streamed_switch_is_bitwise_and_counts_its_wait", "tests/test_gc_watch.py"),
      "the RL step never freezes its setup's objects: every full collection in a switch walks the 350,000 objects "
      "of transformers and the model while holding the GIL"),
    B("logprob_pass_never_runs", "bench/rl/phases.py",
      "            old = self.logprob_pass(x) if self.cfg.logprob_pass else None\n",
      "            old = None\n",
      (f"{LOOP}::test_switch_ngpu_with_the_logprob_pass_serves_it_from_the_rollout_copy",),
      "--logprob-pass runs no log-prob pass before the training step"),
    B("channel_cap_dropped", "bench/rl/groups.py",
      "    mg = build_mesh_groups(rt, shape, dims, prefix=MESH_PREFIX, options=mesh_group_options(cfg))\n",
      "    mg = build_mesh_groups(rt, shape, dims, prefix=MESH_PREFIX)\n",
      (f"{LOOP}::test_a_mesh_groups_options_reach_its_group",),
      "--nccl-max-ctas is accepted and never reaches the mesh's groups: the run says it capped the channels and "
      "did not"),
    B("overlap_queues_the_whole_reload", "bench/rl/config.py",
      "            self.stream_window_mib = OVERLAP_WINDOW_MIB\n",
      "            pass\n",
      (f"{LOOP}::test_step_config_refuses_bad_values",),
      "--overlap-reload queues every piece of the reload at once, so FSDP2's pinned copy waits for all of them"),
)
