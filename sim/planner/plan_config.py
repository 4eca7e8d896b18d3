"""``timeshare plan CONFIG.yaml [key=value ...]``: read a verl or ROLL config, answer in its own keys.

:func:`read_config` loads the YAML with OmegaConf (the library verl's and ROLL's Hydra configs are
built on), applies Hydra-style dotted overrides (``data.train_batch_size=512``), resolves
interpolations (``${response_length}``) and reads what the plan needs: the model, the GPUs, the
parallel layout, the batch and rollout settings and the current offload settings. Which framework it
is comes from its top-level keys (verl: ``actor_rollout_ref``; ROLL: ``actor_train``).

:func:`answer` turns a planned candidate and layout into the keys the user sets, with values,
as a YAML snippet to paste back (:func:`snippet`). Only candidates a framework can express are
planned (:func:`expressible`): verl's FSDP workers offload ``param_offload`` (parameters and
gradients), ``optimizer_offload``, or FSDP2's ``offload_policy``, and keep their NCCL communicators;
verl's Megatron workers offload ``param_offload``, ``grad_offload`` and ``optimizer_offload`` each;
ROLL offloads every state of every role (``is_offload_states``), through ``offload_backend``
``local`` or ``local_dedup``, and suspends communicators with ``offload_nccl``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.planner.plan_inputs import Layout, ModelShape, PlanInputError, Workload, model_preset, shape_from_hf_config

#: aliases of :data:`sim.planner.plan_inputs.MODEL_PRESETS` in model names and paths (lower case, after the org/)
MODEL_ALIASES = {"llama-3.1-70b": "Llama-3-70B", "llama-3.3-70b": "Llama-3-70B", "meta-llama-3-70b": "Llama-3-70B",
                 "llama-2-7b": "Llama-2-7B", "llama-2-13b": "Llama-2-13B", "qwen2.5-7b": "Qwen2.5-7B",
                 "qwen3-4b": "Qwen3-4B", "qwen3-30b-a3b": "Qwen3-30B-A3B", "llama-3-70b": "Llama-3-70B"}


@dataclass
class FrameworkConfig:
    """What a verl or ROLL config says about the job (every field read from it or a named default)."""

    framework: str  # "verl" or "roll"
    family: str  # training backend: "fsdp" or "megatron"
    path: str
    model: ModelShape
    nodes: int
    gpus_per_node: int
    layout: Layout
    workload: Workload
    current: dict[str, Any]  # the offload and NCCL settings the config has now (its own keys)
    gpu_memory_utilization: float | None = None
    notes: list[str] = field(default_factory=list)  # defaults taken for keys the config does not set
    data: dict[str, Any] = field(default_factory=dict)  # the whole config, overrides applied and resolved
    strategy: str = ""  # the training strategy as the config names it (verl: fsdp, fsdp2, megatron)


def _load(path: str, overrides: list[str]) -> dict[str, Any]:
    try:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        raise PlanInputError("reading a verl or ROLL config needs omegaconf (pip install omegaconf)") from None
    p = Path(path)
    if not p.is_file():
        raise PlanInputError(f"{path}: no such file (give a verl or ROLL YAML config)")
    try:
        cfg = OmegaConf.load(p)
        bad = [o for o in overrides if "=" not in o or o.startswith("=")]
        if bad:
            raise PlanInputError(f"override {bad[0]!r}: expected KEY=VALUE, e.g. data.train_batch_size=512")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))
        data = OmegaConf.to_container(cfg, resolve=True)
    except PlanInputError:
        raise
    except (OmegaConfBaseException, UnicodeDecodeError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlanInputError(f"{path}: cannot read the config ({first})") from None
    except Exception as exc:  # noqa: BLE001 - a YAML scanner error and the like: bad input, not a bug
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlanInputError(f"{path}: not a YAML config ({first})") from None
    if not isinstance(data, dict):
        raise PlanInputError(f"{path}: expected a YAML mapping at the top")
    return data


class _Reader:
    """Typed look-ups of dotted keys in a loaded config; a wrong type is a :class:`PlanInputError` naming the key."""

    def __init__(self, data: dict[str, Any], path: str):
        self.data, self.path, self.notes = data, path, []

    def get(self, key: str, default: Any = None, kind: type | None = None, *, note: bool = True) -> Any:
        """The value at dotted ``key`` (``default`` when absent or null), checked to be of ``kind``."""
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node or node[part] is None:
                if note and default is not None:
                    self.notes.append(f"{key} not set: {default}")
                return default
            node = node[part]
        if kind is bool:
            if not isinstance(node, bool):
                raise PlanInputError(f"{self.path}: {key}: expected true or false, got {node!r}")
        elif kind is int:
            if isinstance(node, bool) or not isinstance(node, int):
                raise PlanInputError(f"{self.path}: {key}: expected an integer, got {node!r}")
        elif kind is float:
            if isinstance(node, bool) or not isinstance(node, (int, float)):
                raise PlanInputError(f"{self.path}: {key}: expected a number, got {node!r}")
            node = float(node)
        elif kind is str and not isinstance(node, str):
            raise PlanInputError(f"{self.path}: {key}: expected a string, got {node!r}")
        return node

    def positive(self, key: str, default: int) -> int:
        """An integer >= 1 at ``key`` (``default`` when absent)."""
        v = self.get(key, default, int)
        if v < 1:
            raise PlanInputError(f"{self.path}: {key}: expected an integer >= 1, got {v}")
        return v


def resolve_model(name: str, where: str) -> ModelShape:
    """A model from a config's model path: a directory or file with a ``config.json``, or a preset's name in it."""
    p = Path(name).expanduser()
    for cand in (p / "config.json", p):
        if cand.is_file() and cand.suffix == ".json":
            return shape_from_hf_config(cand)
    tail = name.rstrip("/").split("/")[-1].lower()
    for alias, preset in sorted(MODEL_ALIASES.items(), key=lambda kv: -len(kv[0])):
        if tail.startswith(alias) or f"-{alias}" in tail:
            return model_preset(preset)
    raise PlanInputError(f"{where} {name!r}: not a known model and no config.json there; give --model with a preset "
                         "or a transformers config.json")


def _devices(text: Any, key: str, path: str) -> int | None:
    """The GPU count of a ROLL ``device_mapping`` (``list(range(0,16))`` or a list of ids)."""
    if text is None:
        return None
    if isinstance(text, list):
        return len(text)
    m = re.fullmatch(r"\s*list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)\s*\)\s*", str(text))
    if not m:
        raise PlanInputError(f"{path}: {key}: expected list(range(A,B)) or a list of GPU ids, got {text!r}")
    a, b = (0, int(m.group(1))) if m.group(2) is None else (int(m.group(1)), int(m.group(2)))
    if b <= a:
        raise PlanInputError(f"{path}: {key}: an empty device range {text!r}")
    return b - a


def _verl(r: _Reader) -> FrameworkConfig:
    a = "actor_rollout_ref"
    model = resolve_model(r.get(f"{a}.model.path", None, str) or "", f"{a}.model.path")
    nodes, per_node = r.positive("trainer.nnodes", 1), r.positive("trainer.n_gpus_per_node", 8)
    strategy = r.get(f"{a}.actor.strategy", "fsdp", str)
    prompt_len, resp_len = r.positive("data.max_prompt_length", 512), r.positive("data.max_response_length", 512)
    if r.get(f"{a}.actor.use_dynamic_bsz", False, bool, note=False):
        micro = r.positive(f"{a}.actor.ppo_max_token_len_per_gpu", 16384)
    else:
        micro = r.positive(f"{a}.actor.ppo_micro_batch_size_per_gpu", 8) * (prompt_len + resp_len)
    adv = r.get("algorithm.adv_estimator", "gae", str)
    reference = bool(r.get(f"{a}.actor.use_kl_loss", False, bool, note=False)
                     or r.get("algorithm.use_kl_in_reward", False, bool, note=False))
    reward = None
    if r.get("reward_model.enable", False, bool, note=False):
        reward = resolve_model(r.get("reward_model.model.path", "", str, note=False), "reward_model.model.path")
    w = Workload(prompts=r.positive("data.train_batch_size", 1024), samples_per_prompt=r.positive(f"{a}.rollout.n", 1),
                 prompt_len=prompt_len, response_len=resp_len, micro_batch_tokens=micro, reference=reference,
                 critic=adv == "gae", reward_model=reward)
    gpus = nodes * per_node
    rtp = r.positive(f"{a}.rollout.tensor_model_parallel_size", 1)
    if strategy in ("fsdp", "fsdp2"):
        family = "fsdp"
        cp = r.positive(f"{a}.actor.ulysses_sequence_parallel_size", 1)
        fsdp_size = r.get(f"{a}.actor.fsdp_config.fsdp_size", -1, int, note=False)
        dp = gpus // cp if gpus % cp == 0 else 0
        fsdp = dp if fsdp_size in (-1, 0) or fsdp_size >= dp else fsdp_size
        layout = Layout(dp=dp, cp=cp, fsdp=fsdp, rollout_tp=rtp, shard="all")
        f = f"{a}.actor.fsdp_config"
        current = {f"{f}.param_offload": r.get(f"{f}.param_offload", False, bool, note=False),
                   f"{f}.optimizer_offload": r.get(f"{f}.optimizer_offload", False, bool, note=False),
                   f"{f}.offload_policy": r.get(f"{f}.offload_policy", False, bool, note=False),
                   f"{a}.ref.fsdp_config.param_offload": r.get(f"{a}.ref.fsdp_config.param_offload", False, bool,
                                                               note=False)}
    elif strategy == "megatron":
        family = "megatron"
        g = f"{a}.actor.megatron"
        tp, pp = r.positive(f"{g}.tensor_model_parallel_size", 1), r.positive(f"{g}.pipeline_model_parallel_size", 1)
        cp, ep = r.positive(f"{g}.context_parallel_size", 1), r.positive(f"{g}.expert_model_parallel_size", 1)
        dp = gpus // (tp * pp * cp) if gpus % (tp * pp * cp) == 0 else 0
        layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, fsdp=1, rollout_tp=rtp, shard="optimizer")
        current = {f"{g}.{k}": r.get(f"{g}.{k}", False, bool, note=False)
                   for k in ("param_offload", "grad_offload", "optimizer_offload")}
        current[f"{a}.ref.megatron.param_offload"] = r.get(f"{a}.ref.megatron.param_offload", False, bool, note=False)
    else:
        raise PlanInputError(f"{r.path}: {a}.actor.strategy: expected fsdp, fsdp2 or megatron, got {strategy!r}")
    if not dp:
        raise PlanInputError(f"{r.path}: the parallel sizes do not divide the {gpus} GPUs (trainer.nnodes x "
                             "trainer.n_gpus_per_node)")
    util = r.get(f"{a}.rollout.gpu_memory_utilization", 0.5, float)
    return FrameworkConfig("verl", family, r.path, model, nodes, per_node, layout, w, current, util, r.notes, r.data,
                           strategy)


def _roll(r: _Reader) -> FrameworkConfig:
    model = resolve_model(r.get("pretrain", None, str) or "", "pretrain")
    per_node = r.positive("num_gpus_per_node", 8)
    gpus = _devices(r.get("actor_train.device_mapping", None, note=False), "actor_train.device_mapping", r.path) or per_node
    if gpus % per_node and gpus > per_node:
        raise PlanInputError(f"{r.path}: actor_train.device_mapping: {gpus} GPUs is not a whole number of nodes of "
                             f"num_gpus_per_node {per_node}")
    nodes = max(1, gpus // per_node)
    per_node = min(per_node, gpus)
    prompt_len, resp_len = r.positive("prompt_length", 2048), r.positive("response_length", 4096)
    micro = r.positive("actor_train.training_args.per_device_train_batch_size", 1) * (prompt_len + resp_len)
    w = Workload(prompts=r.positive("rollout_batch_size", 64), samples_per_prompt=r.positive("num_return_sequences_in_group", 8),
                 prompt_len=prompt_len, response_len=resp_len, micro_batch_tokens=micro,
                 reference="reference" in r.data, critic="critic" in r.data)
    sa = "actor_train.strategy_args"
    name = r.get(f"{sa}.strategy_name", "megatron_train", str)
    sc = f"{sa}.strategy_config"
    rtp = r.positive("actor_infer.strategy_args.strategy_config.tensor_parallel_size", 1)
    if name.startswith("megatron"):
        family = "megatron"
        tp, pp = r.positive(f"{sc}.tensor_model_parallel_size", 1), r.positive(f"{sc}.pipeline_model_parallel_size", 1)
        cp, ep = r.positive(f"{sc}.context_parallel_size", 1), r.positive(f"{sc}.expert_model_parallel_size", 1)
        dp = gpus // (tp * pp * cp) if gpus % (tp * pp * cp) == 0 else 0
        layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, fsdp=1, rollout_tp=rtp, shard="optimizer")
    elif name.startswith("fsdp"):
        family, dp = "fsdp", gpus
        layout = Layout(dp=gpus, fsdp=gpus, rollout_tp=rtp, shard="all")
    else:
        raise PlanInputError(f"{r.path}: {sa}.strategy_name: expected megatron_train or fsdp2_train, got {name!r}")
    if not dp:
        raise PlanInputError(f"{r.path}: the parallel sizes do not divide actor_train's {gpus} GPUs")
    current = {"is_offload_states": r.get("is_offload_states", True, bool, note=False),
               "offload_backend": r.get("offload_backend", "local", str, note=False),
               "actor_train.offload_nccl": r.get("actor_train.offload_nccl", False, bool, note=False)}
    if w.reference:
        current["reference.offload_nccl"] = r.get("reference.offload_nccl", False, bool, note=False)
    util = r.get("actor_infer.strategy_args.strategy_config.gpu_memory_utilization", 0.8, float)
    return FrameworkConfig("roll", family, r.path, model, nodes, per_node, layout, w, current, util, r.notes, r.data)


def read_config(path: str, overrides: list[str] | None = None) -> FrameworkConfig:
    """Read a verl or ROLL YAML config with dotted ``overrides`` (see the module docstring)."""
    data = _load(path, list(overrides or []))
    r = _Reader(data, path)
    if "actor_rollout_ref" in data:
        return _verl(r)
    if "actor_train" in data or "pretrain" in data:
        return _roll(r)
    raise PlanInputError(f"{path}: neither a verl config (no actor_rollout_ref) nor a ROLL config (no actor_train)")


def expressible(fc: FrameworkConfig, offload: tuple[str, ...], backend: str, score_offload: bool, pg_policy: str) -> bool:
    """Whether the framework has keys for this candidate (see the module docstring)."""
    if fc.framework == "roll":
        all_ = offload == ("params", "grads", "optimizer")
        return (all_ == score_offload and (all_ or offload == ()) and pg_policy in ("none", "suspend")
                and (backend == "local" or all_))
    if backend != "local" or pg_policy != "none":
        return False
    if fc.family == "fsdp":
        # offload_policy (FSDP2's CPUOffloadPolicy) exists for verl's fsdp2 strategy only
        return offload in ((), ("params", "grads"), ("optimizer",), ("params", "grads", "optimizer")) or (
            offload == ("fsdp_cpu",) and fc.strategy == "fsdp2")
    return offload != ("fsdp_cpu",)


def _megatron_sizes(layout: Layout) -> list[tuple[str, int]]:
    """Megatron-core's names of the parallel sizes (as verl's ``megatron`` and ROLL's ``strategy_config`` use them)."""
    return [("tensor_model_parallel_size", layout.tp), ("pipeline_model_parallel_size", layout.pp),
            ("context_parallel_size", layout.cp), ("expert_model_parallel_size", layout.ep)]


def answer(fc: FrameworkConfig, cand: dict[str, Any], layout: Layout, kv_gib: float, engine_gib: float,
           gpu_gib: float) -> dict[str, Any]:
    """The framework's keys and values for a planned candidate (``Candidate`` fields) on ``layout``."""
    off, so = tuple(cand["offload"]), bool(cand["score_offload"])
    util = min(0.95, max(0.05, int(100 * (engine_gib + kv_gib) / gpu_gib) / 100))
    out: dict[str, Any] = {}
    if fc.framework == "verl":
        a = "actor_rollout_ref"
        if fc.family == "fsdp":
            f = f"{a}.actor.fsdp_config"
            out[f"{f}.param_offload"] = "params" in off
            out[f"{f}.optimizer_offload"] = "optimizer" in off
            if fc.strategy == "fsdp2":
                out[f"{f}.offload_policy"] = off == ("fsdp_cpu",)
            if fc.workload.reference:
                out[f"{a}.ref.fsdp_config.param_offload"] = so
            out[f"{a}.actor.fsdp_config.fsdp_size"] = -1 if layout.fsdp == layout.dp else layout.fsdp
            out[f"{a}.actor.ulysses_sequence_parallel_size"] = layout.cp
        else:
            g = f"{a}.actor.megatron"
            out[f"{g}.param_offload"], out[f"{g}.grad_offload"] = "params" in off, "grads" in off
            out[f"{g}.optimizer_offload"] = "optimizer" in off
            if fc.workload.reference:
                out[f"{a}.ref.megatron.param_offload"] = so
            for k, v in _megatron_sizes(layout):
                out[f"{g}.{k}"] = v
        out[f"{a}.rollout.tensor_model_parallel_size"] = layout.rollout_tp
        out[f"{a}.rollout.gpu_memory_utilization"] = util
        return out
    out["is_offload_states"] = bool(off)
    out["offload_backend"] = cand["backend"]
    out["actor_train.offload_nccl"] = cand["pg_policy"] == "suspend"
    if fc.workload.reference:
        out["reference.offload_nccl"] = cand["pg_policy"] == "suspend"
    sc = "actor_train.strategy_args.strategy_config"
    if fc.family == "megatron":
        for k, v in _megatron_sizes(layout):
            out[f"{sc}.{k}"] = v
    out["actor_infer.strategy_args.strategy_config.tensor_parallel_size"] = layout.rollout_tp
    out["actor_infer.strategy_args.strategy_config.gpu_memory_utilization"] = util
    return out


def snippet(keys: dict[str, Any]) -> str:
    """The keys as nested YAML to paste into the config (through OmegaConf, as the frameworks read it)."""
    from omegaconf import OmegaConf

    def text(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    return OmegaConf.to_yaml(OmegaConf.from_dotlist([f"{k}={text(v)}" for k, v in keys.items()])).rstrip()


_UNSET = object()


def current_value(fc: FrameworkConfig, key: str) -> Any:
    """What the config sets ``key`` to (after overrides), else the framework default the reader assumed, else unset."""
    node: Any = fc.data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return fc.current.get(key, _UNSET)
        node = node[part]
    return node


def changed(fc: FrameworkConfig, keys: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``key -> (now, answer)`` for the keys whose answer differs from the config (``now`` None when it is not set)."""
    out = {}
    for k, v in keys.items():
        now = current_value(fc, k)
        if now is _UNSET or now != v:
            out[k] = (None if now is _UNSET else now, v)
    return out


__all__ = ["FrameworkConfig", "MODEL_ALIASES", "answer", "changed", "current_value", "expressible", "read_config", "resolve_model",
           "snippet"]
