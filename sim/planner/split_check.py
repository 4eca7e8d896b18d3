"""The check ``timeshare plan``'s colocate-or-split answer states: the model's speed-up of splitting on the
published setups (:data:`sim.planner.split.PUBLISHED`) beside the published figures.

``python -m sim.planner.split_check`` prints the table docs/plan.md shows; ``tests/sim/planner/test_split.py``
asserts what docs/plan.md says of it.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sim.planner.plan import Planner, PlanInputs
from sim.planner.plan_inputs import Layout, Workload, model_preset
from sim.planner.plan_rank import recommend
from sim.planner.split import PUBLISHED, SplitOption, rollout_pool, split_options, sync_s, train_pool


def published_setups() -> list[dict[str, Any]]:
    """The published setups of :data:`PUBLISHED` as plan inputs, on one 8 x H20 node with each setup's per-GPU batch
    and its cut of the GPUs scaled to the node (the shipped presets have no multi-node H20 machine): Qwen2.5-7B's
    shapes (Qwen2.5-Math-7B's), DAPO without a reference model, the scripts' prompt and response lengths, token
    budgets and layouts where 6 training GPUs take them (verl's one-step-off Megatron run had TP 2 x PP 2 on 12;
    here TP 2 on 6)."""
    model = model_preset("Qwen2.5-7B")

    def inputs(prompts: int, samples: int, response: int, layout: Layout) -> Any:
        w = Workload(prompts=prompts, samples_per_prompt=samples, prompt_len=2048, response_len=response,
                     micro_batch_tokens=(2048 + response) * 2, reference=False)
        return PlanInputs(model=model, cluster="hgx-h20-8x", layout=layout, workload=w, split=False)

    return [
        {"name": "verl one_step_off_policy, FSDP2", "published": "verl one_step_off_policy", "speedup": 1.23,
         "rollout_gpus": 2, "inputs": inputs(256, 12, 20480, Layout(dp=2, cp=4, fsdp=2, rollout_tp=2))},
        {"name": "verl one_step_off_policy, Megatron", "published": "verl one_step_off_policy", "speedup": 1.40,
         "rollout_gpus": 2, "inputs": inputs(256, 12, 8192, Layout(tp=2, dp=4, fsdp=1, rollout_tp=2,
                                                                    shard="optimizer"))},
        {"name": "verl fully_async_policy, 32 GPUs", "published": "verl fully_async_policy", "speedup": 2.66,
         "rollout_gpus": 4, "inputs": inputs(128, 16, 28672, Layout(dp=2, cp=4, fsdp=2, rollout_tp=4))},
    ]


def check_published() -> list[dict[str, Any]]:
    """The model's speed-up of the published cut (and of its best cut) on each of :func:`published_setups`, beside
    the published figure and range."""
    out = []
    for setup in published_setups():
        inputs = setup["inputs"]
        planner = Planner(inputs)
        colocated, _why = recommend(planner.search(), planner.kv_need_gib)
        options, _sims = split_options(inputs, planner)
        cut = _evaluate_cut(inputs, planner, setup["rollout_gpus"])
        best = min([o for o in [*options, cut] if o.step_s is not None], key=lambda o: o.step_s, default=None)
        low, high = PUBLISHED[setup["published"]]["range"]
        col = colocated.step_s if colocated is not None else None
        out.append({"name": setup["name"], "published_speedup": setup["speedup"], "published_range": (low, high),
                    "colocated_s": col, "colocated_rollout_s": colocated.rollout_s if colocated is not None else None,
                    "cut": f"{cut.rollout_gpus}:{cut.train_gpus}", "cut_step_s": cut.step_s,
                    "cut_rollout_s": cut.rollout_s, "cut_train_s": cut.train_s, "cut_sync_s": cut.sync_s,
                    "speedup": col / cut.step_s if col and cut.step_s else None,
                    "best_cut": f"{best.rollout_gpus}:{best.train_gpus}" if best else None,
                    "best_speedup": col / best.step_s if col and best else None})
    return out


def _evaluate_cut(inputs: Any, planner: Any, rollout_gpus: int) -> SplitOption:
    """One cut, whatever the estimate says of it (the published one)."""
    t = planner.m.gpus - rollout_gpus
    rollout, kv, need, why = rollout_pool(planner, rollout_gpus)
    train, train_why, _n = train_pool(inputs, planner, t)
    sync = sync_s(planner)
    step = max(rollout, train.step_s) + sync if rollout is not None and train is not None else None
    return SplitOption(rollout_gpus, t, rollout, train.step_s if train else None, sync, step, kv, need,
                       train.candidate.label() if train else "", why or ("" if train else train_why),
                       asdict(train.candidate) if train else None)


def main() -> int:
    """``python -m sim.planner.split_check``: the model's speed-ups on the published setups, as docs/plan.md shows them."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    out = logging.getLogger(__name__)
    out.setLevel(logging.INFO)
    out.info("| setup | published | colocated step (rollout) s | published cut: step (rollout, training) s | "
             "model speed-up | best cut: speed-up |")
    out.info("| --- | --- | --- | --- | --- | --- |")
    for r in check_published():
        out.info(f"| {r['name']} | {r['published_speedup']:.2f}x | {r['colocated_s']:.0f} ({r['colocated_rollout_s']:.0f}) "
                 f"| {r['cut']}: {r['cut_step_s']:.0f} ({r['cut_rollout_s']:.0f}, {r['cut_train_s']:.0f}) | "
                 f"{r['speedup']:.2f}x | {r['best_cut']}: {r['best_speedup']:.2f}x |")
    return 0


__all__ = ["check_published", "main", "published_setups"]

if __name__ == "__main__":
    raise SystemExit(main())
