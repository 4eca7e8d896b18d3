"""``timeshare plan CONFIG.yaml [key=value ...]``: read a verl or ROLL config, answer in its own keys.

:func:`read_config` loads the config as Hydra composes it (:mod:`sim.planner.config_load`: a file or
``--config-path`` / ``--config-name``, a defaults list, ``KEY=VALUE`` / ``+KEY=VALUE`` / ``++KEY=VALUE``
overrides), reads what the plan needs (the model, the GPUs, the parallel layout, the batch, the roles and their
offload settings) and checks every key against the framework's own (:mod:`sim.planner.config_keys`: verl
0.9.1's trainer configs, ROLL's ``RLVRConfig``), refusing a key the framework would refuse or ignore while the
plan reads its neighbour. Which framework it is comes from its top-level keys (verl: ``actor_rollout_ref``;
ROLL: ``actor_train``).

:func:`answer` turns a planned candidate and layout into the keys the user sets, with values, for every role
the plan offloads, as a YAML snippet to paste back (:func:`snippet`). Only candidates a framework can express
are planned (:func:`expressible`):

* verl (0.9.1) FSDP workers: per role ``param_offload`` (parameters and gradients), ``optimizer_offload`` and,
  with ``fsdp2``, ``offload_policy`` (FSDP2's CPUOffloadPolicy): the actor's in
  ``actor_rollout_ref.actor.fsdp_config``, the critic's in ``critic.fsdp``, the reference's
  ``actor_rollout_ref.ref.fsdp_config.param_offload``; they keep their NCCL communicators;
* verl Megatron workers: ``param_offload`` (parameters and gradients) and ``optimizer_offload`` in
  ``actor_rollout_ref.actor.megatron``, ``critic.megatron``, and the reference's ``param_offload``;
* verl's reward model is a rollout engine that sleeps between its turns with
  ``reward.reward_model.rollout.free_cache_engine`` (or the legacy ``reward_model.rollout`` key the config uses);
* ROLL offloads every state of every role or none (``is_offload_states``); its ``offload_nccl`` (destroy and
  rebuild the process groups) is forced off by ROLL's ``WorkerConfig`` since v0.3.0, so no PG policy is offered.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.planner.config_keys import KeySchema, check_config, roll_schema, verl_schema
from sim.planner.config_load import LoadedConfig, load_config
from sim.planner.plan_inputs import Layout, ModelShape, PlanInputError, Workload, model_preset, shape_from_hf_config

#: aliases of :data:`sim.planner.plan_inputs.MODEL_PRESETS` in model names and paths (lower case, after the org/)
MODEL_ALIASES = {"llama-3.1-70b": "Llama-3-70B", "llama-3.3-70b": "Llama-3-70B", "meta-llama-3-70b": "Llama-3-70B",
                 "llama-2-7b": "Llama-2-7B", "llama-2-13b": "Llama-2-13B", "qwen2.5-7b": "Qwen2.5-7B",
                 "qwen3-4b": "Qwen3-4B", "qwen3-30b-a3b": "Qwen3-30B-A3B", "llama-3-70b": "Llama-3-70B",
                 "qwen2-7b": "Qwen2-7B", "deepseek-llm-7b": "DeepSeek-LLM-7B"}
#: the store categories a role's offload key moves: a trained role's ``param_offload`` moves the gradients too
TRAINED = ("actor_train", "critic")


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
    current: dict[str, Any]  # the offload settings the config has now, per key (its own keys; defaults filled in)
    gpu_memory_utilization: float | None = None
    notes: list[str] = field(default_factory=list)  # defaults taken for keys the config does not set
    data: dict[str, Any] = field(default_factory=dict)  # the whole config, overrides applied and resolved
    strategy: str = ""  # the training strategy as the config names it (verl: fsdp, fsdp2, megatron)
    # role -> {"params" | "optimizer" | "fsdp_cpu" | "all": the key that offloads it} (ROLL: one "all" key)
    role_keys: dict[str, dict[str, str]] = field(default_factory=dict)
    micro_batch_key: tuple[str, str] = ("", "tokens")  # the key of the trained roles' micro-batch, and its unit
    critic_strategy: str = ""
    ignored: list[str] = field(default_factory=list)  # keys the framework does not define and ignores

    def offloads(self) -> dict[str, set[str]]:
        """What the config's keys offload, per role: ``params``/``grads``/``optimizer``, ``fsdp_cpu`` (FSDP2's
        CPUOffloadPolicy) or, for a scoring role, ``params``; roles that offload nothing are left out."""
        out: dict[str, set[str]] = {}
        for role, keys in self.role_keys.items():
            value = {k: bool(current_value(self, key)) for k, key in keys.items()}
            cats: set[str] = set()
            if value.get("all"):
                cats = {"params", "grads", "optimizer"} if role in TRAINED else {"params"}
            elif value.get("fsdp_cpu"):
                cats = {"fsdp_cpu"}
            else:
                if value.get("params"):
                    cats |= {"params", "grads"} if role in TRAINED else {"params"}
                if value.get("optimizer"):
                    cats.add("optimizer")
            if cats:
                out[role] = cats
        return out


class _Reader:
    """Typed look-ups of dotted keys in a loaded config; a wrong type is a :class:`PlanInputError` naming the key.
    Every key looked up is remembered (:attr:`asked`): the key check refuses a near miss of one."""

    def __init__(self, data: dict[str, Any], path: str):
        self.data, self.path, self.notes = data, path, []
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None, kind: type | None = None, *, note: bool = True) -> Any:
        """The value at dotted ``key`` (``default`` when absent or null), checked to be of ``kind``."""
        self.asked.add(key)
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


# --------------------------------------------------------------------------- verl


def _verl_reward(r: _Reader, reward_model: ModelShape | None) -> tuple[ModelShape | None, str]:
    """(the reward model sharing the GPUs or None, the key that makes it sleep between its turns).

    verl 0.9.1 serves the reward model from a rollout engine (``reward.reward_model``); the legacy ``reward_model``
    section is migrated onto it, its non-null values winning, so the answer uses the key the config uses."""
    legacy_enable = r.get("reward_model.enable", None, bool, note=False)
    enable = legacy_enable if legacy_enable is not None else r.get("reward.reward_model.enable", False, bool, note=False)
    legacy_pool = r.get("reward_model.enable_resource_pool", None, bool, note=False)
    own_pool = legacy_pool if legacy_pool is not None else r.get("reward.reward_model.enable_resource_pool", False, bool,
                                                                 note=False)
    legacy_sleep = r.get("reward_model.rollout.free_cache_engine", None, bool, note=False)
    key = ("reward_model.rollout.free_cache_engine" if legacy_sleep is not None
           else "reward.reward_model.rollout.free_cache_engine")
    if not enable or own_pool:  # no reward model, or one on a pool of its own: not sharing these GPUs
        return None, key
    if reward_model is not None:
        return reward_model, key
    path = r.get("reward_model.model.path", None, str, note=False) or r.get("reward.reward_model.model_path", "", str,
                                                                             note=False)
    return resolve_model(path, "reward.reward_model.model_path"), key


def _verl_layout(r: _Reader, strategy: str, gpus: int, rtp: int) -> tuple[str, Layout, int]:
    a = "actor_rollout_ref"
    if strategy in ("fsdp", "fsdp2"):
        cp = r.positive(f"{a}.actor.ulysses_sequence_parallel_size", 1)
        fsdp_size = r.get(f"{a}.actor.fsdp_config.fsdp_size", -1, int, note=False)
        dp = gpus // cp if gpus % cp == 0 else 0
        fsdp = dp if fsdp_size in (-1, 0) or fsdp_size >= dp else fsdp_size
        return "fsdp", Layout(dp=dp, cp=cp, fsdp=fsdp, rollout_tp=rtp, shard="all"), dp
    if strategy == "megatron":
        g = f"{a}.actor.megatron"
        tp, pp = r.positive(f"{g}.tensor_model_parallel_size", 1), r.positive(f"{g}.pipeline_model_parallel_size", 1)
        cp, ep = r.positive(f"{g}.context_parallel_size", 1), r.positive(f"{g}.expert_model_parallel_size", 1)
        dp = gpus // (tp * pp * cp) if gpus % (tp * pp * cp) == 0 else 0
        return "megatron", Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, fsdp=1, rollout_tp=rtp, shard="optimizer"), dp
    raise PlanInputError(f"{r.path}: {a}.actor.strategy: expected fsdp, fsdp2 or megatron, got {strategy!r}")


def _verl_role_keys(family: str, strategy: str, critic_strategy: str, w: Workload, reward_key: str
                    ) -> dict[str, dict[str, str]]:
    """The keys that offload each role of a verl job (verl 0.9.1's names)."""
    a = "actor_rollout_ref"
    if family == "fsdp":
        keys = {"actor_train": {"params": f"{a}.actor.fsdp_config.param_offload",
                                "optimizer": f"{a}.actor.fsdp_config.optimizer_offload"},
                "reference": {"params": f"{a}.ref.fsdp_config.param_offload"},
                "critic": {"params": "critic.fsdp.param_offload", "optimizer": "critic.fsdp.optimizer_offload"}}
        if strategy == "fsdp2":
            keys["actor_train"]["fsdp_cpu"] = f"{a}.actor.fsdp_config.offload_policy"
        if critic_strategy == "fsdp2":
            keys["critic"]["fsdp_cpu"] = "critic.fsdp.offload_policy"
    else:
        keys = {"actor_train": {"params": f"{a}.actor.megatron.param_offload",
                                "optimizer": f"{a}.actor.megatron.optimizer_offload"},
                "reference": {"params": f"{a}.ref.megatron.param_offload"},
                "critic": {"params": "critic.megatron.param_offload", "optimizer": "critic.megatron.optimizer_offload"}}
    keys["reward"] = {"params": reward_key}
    return {role: k for role, k in keys.items() if role in w.roles()}


def _verl(r: _Reader, model: ModelShape | None, reward_model: ModelShape | None) -> FrameworkConfig:
    a = "actor_rollout_ref"
    if model is None:
        model = resolve_model(r.get(f"{a}.model.path", None, str) or "", f"{a}.model.path")
    nodes, per_node = r.positive("trainer.nnodes", 1), r.positive("trainer.n_gpus_per_node", 8)
    strategy = r.get(f"{a}.actor.strategy", "fsdp", str)
    prompt_len, resp_len = r.positive("data.max_prompt_length", 512), r.positive("data.max_response_length", 512)
    if r.get(f"{a}.actor.use_dynamic_bsz", False, bool, note=False):
        micro_key = (f"{a}.actor.ppo_max_token_len_per_gpu", "tokens")
        micro = r.positive(micro_key[0], 16384)
    else:
        micro_key = (f"{a}.actor.ppo_micro_batch_size_per_gpu", "sequences")
        micro = r.positive(micro_key[0], 8) * (prompt_len + resp_len)
    reference = bool(r.get(f"{a}.actor.use_kl_loss", False, bool, note=False)
                     or r.get("algorithm.use_kl_in_reward", False, bool, note=False))
    reward, reward_key = _verl_reward(r, reward_model)
    w = Workload(prompts=r.positive("data.train_batch_size", 1024), samples_per_prompt=r.positive(f"{a}.rollout.n", 1),
                 prompt_len=prompt_len, response_len=resp_len, micro_batch_tokens=micro, reference=reference,
                 critic=r.get("algorithm.adv_estimator", "gae", str) == "gae", reward_model=reward)
    gpus = nodes * per_node
    rtp = r.positive(f"{a}.rollout.tensor_model_parallel_size", 1)
    family, layout, dp = _verl_layout(r, strategy, gpus, rtp)
    critic_strategy = r.get("critic.strategy", "fsdp" if family == "fsdp" else "megatron", str, note=False)
    if w.critic and (critic_strategy in ("fsdp", "fsdp2")) != (family == "fsdp"):
        raise PlanInputError(f"{r.path}: critic.strategy {critic_strategy} with {a}.actor.strategy {strategy}: the plan "
                             "takes one training backend for the actor and the critic")
    if not dp:
        raise PlanInputError(f"{r.path}: the parallel sizes do not divide the {gpus} GPUs (trainer.nnodes x "
                             "trainer.n_gpus_per_node)")
    role_keys = _verl_role_keys(family, strategy, critic_strategy, w, reward_key)
    current = {}
    for role, keys in role_keys.items():
        for what, key in keys.items():
            default = what == "params" and role == "reward"  # verl's rollout engines sleep by default
            if family == "megatron" and role == "reference":  # verl's ref inherits the actor's param_offload
                default = current.get(f"{a}.actor.megatron.param_offload", False)
            current[key] = r.get(key, default, bool, note=False)
    util = r.get(f"{a}.rollout.gpu_memory_utilization", 0.5, float)
    return FrameworkConfig("verl", family, r.path, model, nodes, per_node, layout, w, current, util, r.notes, r.data,
                           strategy, role_keys, micro_key, critic_strategy)


# --------------------------------------------------------------------------- ROLL


def _roll(r: _Reader, model: ModelShape | None) -> FrameworkConfig:
    if model is None:
        model = resolve_model(r.get("pretrain", None, str) or "", "pretrain")
    per_node = r.positive("num_gpus_per_node", 8)
    gpus = _devices(r.get("actor_train.device_mapping", None, note=False), "actor_train.device_mapping", r.path) or per_node
    if gpus % per_node and gpus > per_node:
        raise PlanInputError(f"{r.path}: actor_train.device_mapping: {gpus} GPUs is not a whole number of nodes of "
                             f"num_gpus_per_node {per_node}")
    nodes = max(1, gpus // per_node)
    per_node = min(per_node, gpus)
    prompt_len, resp_len = r.positive("prompt_length", 2048), r.positive("response_length", 4096)
    micro_key = ("actor_train.training_args.per_device_train_batch_size", "sequences")
    micro = r.positive(micro_key[0], 1) * (prompt_len + resp_len)
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
    current = {"is_offload_states": r.get("is_offload_states", False, bool, note=False)}  # ROLL's default: False
    role_keys = {role: {"all": "is_offload_states"} for role in w.roles() if role != "rollout"}
    util = r.get("actor_infer.strategy_args.strategy_config.gpu_memory_utilization", 0.8, float)
    return FrameworkConfig("roll", family, r.path, model, nodes, per_node, layout, w, current, util, r.notes, r.data,
                           name, role_keys, micro_key)


# --------------------------------------------------------------------------- reading and checking


def _schemas(fc: FrameworkConfig) -> tuple[KeySchema, KeySchema | None]:
    if fc.framework == "roll":
        return roll_schema(), None
    other = "megatron" if fc.family == "fsdp" else "fsdp"
    return verl_schema(fc.family), verl_schema(other)


def read_config(path: str | None, overrides: list[str] | None = None, *, config_path: str | None = None,
                config_name: str | None = None, model: ModelShape | None = None,
                reward_model: ModelShape | None = None) -> FrameworkConfig:
    """Read a verl or ROLL config (see the module docstring); ``model`` / ``reward_model``, when given (``--model``,
    ``--reward-model``), stand for the config's model paths, which are then not looked at."""
    loaded: LoadedConfig = load_config(path, list(overrides or []), config_path=config_path, config_name=config_name)
    data = loaded.data
    r = _Reader(data, loaded.path)
    if "actor_rollout_ref" in data:
        fc = _verl(r, model, reward_model)
    elif "actor_train" in data or "pretrain" in data:
        fc = _roll(r, model)
    else:
        raise PlanInputError(f"{loaded.path}: neither a verl config (no actor_rollout_ref) nor a ROLL config (no "
                             "actor_train)")
    schema, other = _schemas(fc)
    fc.ignored = check_config(loaded.file_keys, loaded.overrides, schema, other=other, strategy=fc.strategy,
                              path=loaded.path, reads=r.asked)
    fc.notes = loaded.notes + fc.notes
    return fc


def expressible(fc: FrameworkConfig, offload: tuple[str, ...], backend: str, score_offload: bool, pg_policy: str) -> bool:
    """Whether the framework has keys for this candidate (see the module docstring)."""
    if fc.framework == "roll":
        all_ = offload == ("params", "grads", "optimizer")
        return all_ == score_offload and (all_ or offload == ()) and pg_policy == "none" and backend == "local"
    if backend != "local" or pg_policy != "none":
        return False
    if offload == ("fsdp_cpu",):  # FSDP2's CPUOffloadPolicy: verl's fsdp2 strategy, for every trained role
        return fc.family == "fsdp" and all("fsdp_cpu" in fc.role_keys[r] for r in TRAINED if r in fc.role_keys)
    # param_offload moves parameters and gradients together, in verl's FSDP and (0.9) Megatron workers alike
    return offload in ((), ("params", "grads"), ("optimizer",), ("params", "grads", "optimizer"))


def _megatron_sizes(layout: Layout) -> list[tuple[str, int]]:
    """Megatron-core's names of the parallel sizes (as verl's ``megatron`` and ROLL's ``strategy_config`` use them)."""
    return [("tensor_model_parallel_size", layout.tp), ("pipeline_model_parallel_size", layout.pp),
            ("context_parallel_size", layout.cp), ("expert_model_parallel_size", layout.ep)]


def offload_keys(fc: FrameworkConfig, cand: dict[str, Any]) -> dict[str, Any]:
    """The offload key of every role of the job, set as candidate ``cand`` (``Candidate`` fields) offloads it."""
    off, so = tuple(cand["offload"]), bool(cand["score_offload"])
    out: dict[str, Any] = {}
    for role, keys in fc.role_keys.items():
        for what, key in keys.items():
            if what == "all":
                out[key] = bool(off)
            elif role not in TRAINED:
                out[key] = so
            elif what == "fsdp_cpu":
                out[key] = off == ("fsdp_cpu",)
            else:
                out[key] = what in off
    return out


def answer(fc: FrameworkConfig, cand: dict[str, Any], layout: Layout, kv_gib: float, engine_gib: float,
           gpu_gib: float) -> dict[str, Any]:
    """The framework's keys and values for a planned candidate (``Candidate`` fields) on ``layout``: every role's
    offload keys, the layout, the rollout's tensor parallel and memory."""
    util = min(0.95, max(0.05, int(100 * (engine_gib + kv_gib) / gpu_gib) / 100))
    out = offload_keys(fc, cand)
    if fc.framework == "verl":
        a = "actor_rollout_ref"
        if fc.family == "fsdp":
            out[f"{a}.actor.fsdp_config.fsdp_size"] = -1 if layout.fsdp == layout.dp else layout.fsdp
            out[f"{a}.actor.ulysses_sequence_parallel_size"] = layout.cp
        else:
            for section in (f"{a}.actor", f"{a}.ref", "critic"):
                role = {"critic": "critic", f"{a}.ref": "reference"}.get(section, "actor_train")
                if role in fc.role_keys:
                    for k, v in _megatron_sizes(layout):
                        out[f"{section}.megatron.{k}"] = v
        out[f"{a}.rollout.tensor_model_parallel_size"] = layout.rollout_tp
        out[f"{a}.rollout.gpu_memory_utilization"] = util
        return out
    sc = "actor_train.strategy_args.strategy_config"
    if fc.family == "megatron":
        for k, v in _megatron_sizes(layout):
            out[f"{sc}.{k}"] = v
    out["actor_infer.strategy_args.strategy_config.tensor_parallel_size"] = layout.rollout_tp
    out["actor_infer.strategy_args.strategy_config.gpu_memory_utilization"] = util
    return out


def split_answer(fc: FrameworkConfig, option: dict[str, Any], gpus_per_node: int) -> dict[str, Any]:
    """The framework's keys for a split (:class:`sim.planner.split.SplitOption` fields): the two pools, one step off
    policy, the training pool's offload keys; and how the framework runs it (``entry``)."""
    rollout, train = option["rollout_gpus"], option["train_gpus"]
    keys = offload_keys(fc, option["train_offload"]) if option.get("train_offload") else {}
    if fc.framework == "verl":
        one_node = rollout + train <= gpus_per_node
        per = gpus_per_node if not one_node else None
        keys["actor_rollout_ref.hybrid_engine"] = False
        keys["trainer.nnodes"], keys["trainer.n_gpus_per_node"] = (1, train) if one_node else (train // per, per)
        keys["rollout.nnodes"], keys["rollout.n_gpus_per_node"] = (1, rollout) if one_node else (rollout // per, per)
        name = "one_step_off_ppo_trainer" if fc.family == "fsdp" else "one_step_off_ppo_megatron_trainer"
        entry = (f"python -m verl.experimental.one_step_off_policy.main_ppo --config-name {name} (verl's one step off "
                 "policy trainer; its config adds the rollout pool's rollout.nnodes and rollout.n_gpus_per_node)")
        return {"keys": keys, "entry": entry}
    keys["async_generation_ratio"] = 1  # one batch generated ahead: one step off policy
    keys["generate_opt_level"] = 1  # ROLL's asynchronous pipeline asks for it
    train_map = f"list(range(0,{train}))"
    keys["actor_train.device_mapping"] = train_map
    keys["actor_infer.device_mapping"] = f"list(range({train},{train + rollout}))"
    for role, section in (("reference", "reference"), ("critic", "critic")):
        if role in fc.role_keys:
            keys[f"{section}.device_mapping"] = train_map
    return {"keys": keys, "entry": "ROLL's RLVR pipeline with async_generation_ratio 1 (its asynchronous training)"}


def micro_batch_fix(fc: FrameworkConfig, tokens: int, seq_len: int) -> dict[str, int] | None:
    """The config's micro-batch key set to at most ``tokens`` a micro-batch (sequences of ``seq_len`` tokens where
    the key counts sequences); None when not even one sequence fits."""
    key, unit = fc.micro_batch_key
    if not key:
        return None
    value = tokens // seq_len if unit == "sequences" else tokens
    return {key: value} if value >= 1 else None


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
        if not isinstance(node, dict) or part not in node or node[part] is None:
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


__all__ = ["FrameworkConfig", "MODEL_ALIASES", "TRAINED", "answer", "changed", "current_value", "expressible",
           "micro_batch_fix", "offload_keys", "split_answer", "read_config", "resolve_model", "snippet"]
