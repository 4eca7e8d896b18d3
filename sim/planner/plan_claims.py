"""The verl articles' offload claims, checked with ``timeshare plan`` (docs/plan.md has the numbers).

The claims (/work/shared/seeds/002_5c8ee56044d194a3.txt and 003_3bd95aca0ea523ab.txt):

1. parameter offload is not worth it for 7-13B models on 80 GB cards;
2. offloading the reference model saves little;
3. offload slows the actor update on 8 cards with NVLink (the article: 35-42% on 8xA100 80G for 13B).

:func:`claim_cases` runs the plan cases on the ``hgx-a100-80g-8x`` preset (8 x 80 GB, NVLink 3,
PCIe Gen4) and returns, per case, the figures the claims are about.
``python -m sim.planner.plan_claims`` prints them.
"""
from __future__ import annotations

from typing import Any

from sim.planner.plan import Candidate, PlanInputs, Planner
from sim.planner.plan_inputs import GiB, Layout, Workload, model_preset

#: (case name, model preset, workload) — the article's batch is 60 prompts x 12 samples
CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("7B, article batch", "Qwen2.5-7B", {"prompts": 60, "samples_per_prompt": 12}),
    ("7B, 256 x 8 batch", "Qwen2.5-7B", {}),
    ("13B, article batch, KV need met (16 GiB)", "Llama-2-13B", {"prompts": 60, "samples_per_prompt": 12, "kv_gib": 16.0}),
    ("13B, article batch, whole batch in KV", "Llama-2-13B", {"prompts": 60, "samples_per_prompt": 12}),
)


def claim_case(model: str, workload: dict[str, Any], cluster: str = "hgx-a100-80g-8x") -> dict[str, Any]:
    """The figures of one case: no offload vs params offload vs FSDP CPU policy vs reference offload."""
    p = Planner(PlanInputs(model=model_preset(model), cluster=cluster, layout=Layout(dp=8), workload=Workload(**workload)))
    order = p.orders()[0]

    def ev(off: tuple[str, ...], score: bool):
        return p.evaluate(Candidate(off, "local", score, "none", order))

    none, params, cpu, ref = ev((), False), ev(("params",), False), ev(("fsdp_cpu",), False), ev((), True)
    ranked = p.search()
    best = next((o for o in ranked if o.feasible), None)
    gpu_gib = p.m.gpu_bytes / GiB
    return {
        "model": model,
        "gpu_gib": gpu_gib,
        "no_offload_step_s": none.step_s,
        "no_offload_feasible": none.feasible,
        "params_offload_step_s": params.step_s,
        "params_offload_gain_gib": params.rollout_gib - none.rollout_gib,
        "fsdp_cpu_actor_s": cpu.compute_s["actor_train"],
        "actor_s": none.compute_s["actor_train"],
        "fsdp_cpu_slowdown": cpu.compute_s["actor_train"] / none.compute_s["actor_train"] - 1,
        "fsdp_cpu_step_s": cpu.step_s,
        "ref_offload_gain_gib": ref.rollout_gib - none.rollout_gib,
        "ref_offload_step_s": ref.step_s,
        "recommended": best.candidate.label() if best else None,
        "recommended_offload": list(best.candidate.offload) if best else None,
        "recommended_step_s": best.step_s if best else None,
    }


def claim_cases() -> list[dict[str, Any]]:
    """Every case of :data:`CASES` (a few seconds each)."""
    return [{"case": name, **claim_case(model, w)} for name, model, w in CASES]


def main() -> None:
    """Print the cases as a table (docs/plan.md quotes it)."""
    rows = claim_cases()
    head = (f"{'case':<42}{'no off s':>9}{'params s':>9}{'gain GiB':>9}{'ref s':>8}{'ref GiB':>8}"
            f"{'actor s':>8}{'cpu act s':>10}{'slower':>7}  recommended")
    print(head)
    for r in rows:
        print(f"{r['case']:<42}{r['no_offload_step_s']:>9.2f}{r['params_offload_step_s']:>9.2f}"
              f"{r['params_offload_gain_gib']:>9.2f}{r['ref_offload_step_s']:>8.2f}{r['ref_offload_gain_gib']:>8.2f}"
              f"{r['actor_s']:>8.1f}{r['fsdp_cpu_actor_s']:>10.1f}{r['fsdp_cpu_slowdown']:>7.1%}  {r['recommended']}"
              f" ({r['recommended_step_s']:.2f} s)")


if __name__ == "__main__":
    main()


__all__ = ["CASES", "claim_case", "claim_cases", "main"]
