"""A colocated RLVR pipeline with roles as Ray actors sharing the GPUs (CPU/Gloo when there is no GPU).

    python -m bench.ray_pipeline                       # 2 ranks on CPU (or the GPUs), 2 roles, 2 steps
    python -m bench.ray_pipeline --roles 3 --compare   # + a reference role; checked bitwise against no offload

Theory of operation
-------------------
The roles (:mod:`refimpl.worker.pipeline` drives them) are Ray actors on one
:class:`~refimpl.worker.ResourcePool`, each rank of each role on the same GPU
(``1/roles`` of it):

* ``actor_train``: a small causal LM (:class:`TinyLM`) sharded with FSDP2 over
  the role's ranks, AdamW, both in an :class:`~refimpl.store.OffloadStore`; its
  group ``actor_train.dp`` (the loss's all-reduce) is under a
  :class:`~refimpl.comm.PGLifecycle`, so the state control's offload pauses it
  (``DESTROY_DEFERRED``: destroyed, the port's cooldown deferred) and the reload
  resumes it; the weight sync runs under ``lifecycle.weight_sync``. With two roles it
  also holds a frozen copy of the initial policy and serves the reference log-probs.
* ``reference`` (``--roles 3``): the frozen initial policy, FSDP2, in its own store.
* ``actor_infer``: an unsharded copy that samples ``new_tokens`` per prompt
  (seeded per step and rank), its weights in a store.

``--out DIR`` writes ``ray_pipeline.json``: per role and method the onload and
offload times and bytes (GB/s, and the ratio to the line rate measured at start
in the same run on CUDA), the peak device memory of each call (the role's
allocator) and the device memory in use after each phase (the driver's
``cudaMemGetInfo``: every role), the RPC time of each call and its overhead
beyond the slowest rank's time inside the call, the step phases' times, and with
``--compare`` whether the run matched the no-offload run bitwise.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from refimpl.worker import RoleWorker, WorkerStateControl, register
from refimpl.worker.pipeline import Batch

logger = logging.getLogger(__name__)


class TinyLM(torch.nn.Module):
    """Embedding, a causal prefix mean, ``layers`` residual MLP blocks, an LM head: a policy with no attention kernels."""

    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                                torch.nn.Linear(4 * hidden, hidden)) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)``; position ``t`` sees tokens ``0..t`` only."""
        h = self.embed(tokens)
        steps = torch.arange(1, tokens.shape[1] + 1, device=h.device, dtype=h.dtype).view(1, -1, 1)
        h = torch.cumsum(h, dim=1) / steps
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def token_log_probs(model: torch.nn.Module, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Log-probability of each response token (positions ``prompt_len..``) under ``model``."""
    logits = model(seq[:, :-1]).float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, seq[:, 1:, None]).squeeze(-1)
    return lp[:, prompt_len - 1:]


class _ModelWorker(RoleWorker):
    """What every role's worker shares: the device, the process group, peak memory per call."""

    def _init_dist(self) -> torch.device:
        cuda = self.config.get("device") == "cuda"
        if not cuda:
            torch.set_num_threads(1)
        if cuda:
            torch.cuda.set_device(0)  # Ray made the bundle's GPU the only visible one
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {self.role}[{self.rank}] %(name)s %(message)s")
        logging.getLogger("refimpl.worker.role").setLevel(logging.INFO)
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        return self.device

    def _model(self, seed: int) -> TinyLM:
        c = self.config
        torch.manual_seed(seed)  # every role builds the same initial policy
        with torch.device(self.device):
            return TinyLM(c["vocab"], c["hidden"], c["layers"])

    def _shard(self, model: TinyLM) -> TinyLM:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    def _store(self):
        from refimpl.store import OffloadStore
        from refimpl.torch_runtime import TorchRuntime

        self.rt = TorchRuntime(self.device)
        return OffloadStore(self.rt)

    def before_call(self, name: str) -> None:
        """Reset the allocator's peak (CUDA) so each call records its own."""
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def after_call(self, name: str, metrics: dict[str, float]) -> None:
        """Add ``memory/peak_gb/<name>``: this role's allocator peak during the call (CUDA)."""
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            torch.cuda.synchronize()
            metrics[f"memory/peak_gb/{name}"] = torch.cuda.max_memory_allocated() / 2**30

    @register(offload=False)
    def line_rates(self, mib: int) -> dict[str, float]:
        """H2D and D2H GB/s between pinned host memory and the device (best of 4); empty on CPU."""
        if self.device.type != "cuda":
            return {}
        n = mib << 20
        host = self.rt.alloc_host(n, torch.uint8, pinned=True, tag="line")
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        out = {}
        for name, (dst, src) in (("h2d_gbps", (dev, host)), ("d2h_gbps", (host, dev))):
            best = float("inf")
            for _ in range(4):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            out[name] = n / best / 1e9
        self.rt.free_host(host)
        del dev
        return out


class ActorTrainWorker(_ModelWorker):
    """The trained policy (FSDP2 + AdamW), its group under a PGLifecycle; with ``hold_reference`` also the frozen initial one."""

    @register(offload=False)
    def init_model(self, seed: int, generation: int = 0) -> int:
        """Build (or build again: ``generation`` names fresh groups) the model, optimizer, store and lifecycle."""
        from refimpl.comm import LifecycleConfig, PGLifecycle
        from refimpl.runtime import GroupSpec

        self._init_dist()
        if self.state_control is not None:
            self.state_control.store.close()
        c = self.config
        self.model = self._shard(self._model(seed))
        self.ref = None
        if c.get("hold_reference"):
            self.ref = self._shard(self._model(seed))
            self.ref.requires_grad_(False)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=c.get("lr", 1e-2))
        store = self._store()
        store.attach_module(self.model, name="model")
        store.attach_optimizer(self.optim, name="optim")
        if self.ref is not None:
            store.attach_module(self.ref, name="reference")
        self.dp = f"actor_train.dp.{generation}"
        self.lc = PGLifecycle(self.rt, [GroupSpec(self.dp, tuple(range(self.world_size)))], config=LifecycleConfig(
            policy=c.get("policy", "destroy_deferred"), cooldown_s=c.get("cooldown_s", 0.05), agree_timeout_s=120,
            canary_timeout_s=60, control_group=f"actor_train.control.{generation}"))
        self.lc.sync.start()
        self.state_control = WorkerStateControl(store, lifecycle=self.lc)
        return sum(p.numel() for p in self.model.parameters())

    @register(dispatch="scatter")
    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        """Response-token log-probs under the current policy (``meta_info["use_reference"]``: the frozen copy)."""
        model = self.ref if batch.meta_info.get("use_reference") else self.model
        if model is None:
            raise ValueError("use_reference: this actor_train holds no reference copy (start it with hold_reference)")
        with torch.no_grad():
            seq = batch.tensors["sequences"].to(self.device)
            lp = token_log_probs(model, seq, self.config["prompt_len"]).cpu()
        model.reshard()  # FSDP2's root stays unsharded after a forward without backward; the store offloads shards
        return lp

    @register(dispatch="scatter")
    def train_step(self, batch: Batch) -> float:
        """One policy-gradient step (ratio x advantage, KL to the reference); the loss averaged over the ranks."""
        from refimpl.runtime import ReduceOp

        t = {k: v.to(self.device) for k, v in batch.tensors.items()}
        lp = token_log_probs(self.model, t["sequences"], self.config["prompt_len"])
        ratio = torch.exp(lp - t["old_log_probs"])
        loss = -(ratio * t["advantages"][:, None]).mean() + 0.1 * (lp - t["ref_log_probs"]).mean()
        loss.backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        total = loss.detach().float().reshape(1).clone()
        self.rt.run(self.rt.all_reduce(total, ReduceOp.SUM, group=self.dp, timeout_s=120))
        return float(total.item()) / self.world_size

    @register(offload=False, collect="rank0")
    def gather_weights(self, ipc: bool = True) -> Any:
        """Full weights under ``lifecycle.weight_sync`` (params reloaded for the gather, then put back); rank 0
        publishes them for ``actor_infer.load_weights``: on CUDA (``ipc``) as CUDA IPC handles of device
        copies it holds until its next call (see :func:`share_weights`), else through Ray's object store."""
        on_device = ipc and self.device.type == "cuda"
        full = self._gather(on_device)
        if self.rank != 0:
            return None
        if on_device:
            self._shared, payload = share_weights(full)  # held until the receiver has copied them
            return self.publish(payload)
        return self.publish(full)

    def _gather(self, on_device: bool) -> dict[str, torch.Tensor]:
        """The full weights (device copies, or host copies) under ``lifecycle.weight_sync``."""
        store = self.state_control.store

        def gather() -> dict[str, torch.Tensor]:
            was = store.is_offloaded("params")
            if was:
                store.reload("params")
            full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                    for n, p in self.model.named_parameters()}
            full = {n: t.clone() if on_device else t.to("cpu", copy=True) for n, t in full.items()}
            if was:
                store.offload("params")
            return full

        return self.lc.sync.weight_sync(gather)

    @register(offload=False, collect="rank0")
    def weight_digests(self) -> list[int] | None:
        """Integer digests of the full weights in parameter order, computed where they are (rank 0's)."""
        full = self._gather(self.device.type == "cuda")
        return [_digest(t) for t in full.values()] if self.rank == 0 else None

    def before_call(self, name: str) -> None:
        """Drop the device copies the last weight sync shared (the receiver has copied them), then as the base."""
        if getattr(self, "_shared", None) is not None:
            self._shared = None
            torch.cuda.ipc_collect()
        super().before_call(name)

    @register(offload=False)
    def lifecycle_stats(self) -> dict[str, Any]:
        """The role's PGLifecycle: its state and counters (pauses, resumes, weight syncs, destroys, rebuilds)."""
        import dataclasses

        return {"state": self.lc.state.name, **dataclasses.asdict(self.lc.stats)}


class ReferenceWorker(_ModelWorker):
    """The frozen initial policy, FSDP2, in its own store."""

    @register(offload=False)
    def init_model(self, seed: int, generation: int = 0) -> int:
        """Build the frozen policy and its store."""
        self._init_dist()
        if self.state_control is not None:
            self.state_control.store.close()
        self.model = self._shard(self._model(seed))
        self.model.requires_grad_(False)
        store = self._store()
        store.attach_module(self.model, name="reference")
        self.state_control = WorkerStateControl(store)
        return sum(p.numel() for p in self.model.parameters())

    @register(dispatch="scatter")
    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        """Response-token log-probs under the initial policy."""
        with torch.no_grad():
            seq = batch.tensors["sequences"].to(self.device)
            lp = token_log_probs(self.model, seq, self.config["prompt_len"]).cpu()
        self.model.reshard()  # FSDP2's root stays unsharded after a forward without backward; the store offloads shards
        return lp


class ActorInferWorker(_ModelWorker):
    """The generation engine: an unsharded copy of the policy that samples tokens."""

    @register(offload=False)
    def init_model(self, seed: int, generation: int = 0) -> int:
        """Build the engine's copy (its weights come from ``load_weights``) and its store."""
        self._init_dist()
        if self.state_control is not None:
            self.state_control.store.close()
        self.seed = seed
        self.model = self._model(seed + 1).eval()  # other weights on purpose: the first sync must overwrite them
        self.model.requires_grad_(False)
        store = self._store()
        store.attach_module(self.model, name="engine")
        self.state_control = WorkerStateControl(store)
        return sum(p.numel() for p in self.model.parameters())

    @register(dispatch="scatter")
    def generate(self, batch: Batch) -> torch.Tensor:
        """Sample ``new_tokens`` after each prompt (seeded by step and rank); the sequences on the host."""
        g = torch.Generator().manual_seed(self.seed * 7919 + batch.meta_info["step"] * 101 + self.rank)
        seq = batch.tensors["prompts"].to(self.device)
        with torch.no_grad():
            for _ in range(self.config["new_tokens"]):
                probs = torch.softmax(self.model(seq)[:, -1].float(), dim=-1).cpu()
                nxt = torch.multinomial(probs, 1, generator=g).to(self.device)
                seq = torch.cat([seq, nxt], dim=1)
        return seq.cpu()

    @register
    def load_weights(self, ref: Any, meta_info: dict[str, Any] | None = None) -> None:
        """Copy the weights actor_train published into the engine's (reloaded for it, offloaded after)."""
        full = self.fetch(ref)
        with torch.no_grad():
            if isinstance(full, dict) and full.get("kind") == "cuda_ipc":
                copy_shared_weights(full, dict(self.model.named_parameters()))
                return
            for n, p in self.model.named_parameters():
                p.copy_(full[n].to(p.dtype))


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


class WeightSyncError(RuntimeError):
    """The weights were shared as CUDA IPC handles but this role cannot open them (another host)."""


def share_weights(full: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """CUDA IPC handles of ``full`` (device tensors), as verl and ROLL hand weights to a colocated engine:
    ``(tensors to keep alive until the receiver has copied them, the picklable payload)``."""
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.synchronize()  # the copies are complete before another process reads them
    return full, {"kind": "cuda_ipc", "host": _node_ip(), "tensors": {n: reduce_tensor(t) for n, t in full.items()}}


def copy_shared_weights(payload: dict[str, Any], params: dict[str, torch.Tensor]) -> None:
    """Open the handles of :func:`share_weights`, copy each into ``params[name]`` (bitwise; dtype as the
    param's), synchronise and let go of them (the sender frees its copies at its next call)."""
    if payload["host"] != _node_ip():
        raise WeightSyncError(f"weights shared as CUDA IPC handles on {payload['host']} cannot be opened on "
                              f"{_node_ip()}; call gather_weights(ipc=False) to send them through the object store")
    for n, (rebuild, args) in payload["tensors"].items():
        src = rebuild(*args)
        params[n].copy_(src.to(params[n].dtype))
        del src
    torch.cuda.synchronize()


def _digest(t: torch.Tensor) -> int:
    bits = t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[t.element_size()])
    bits = bits.reshape(-1).to(torch.int64)
    w = torch.arange(bits.numel(), dtype=torch.int64, device=bits.device) % 1021 + 1
    return int((bits * w).sum().item())


# ---------------------------------------------------------------------------- the driver

def weight_digests(actor_train: Any) -> list[int]:
    """Integer digests of actor_train's full weights, in parameter order (bitwise comparisons between runs)."""
    return actor_train.weight_digests()


def build(cfg: dict[str, Any], roles: int, ranks: int, device: str) -> tuple[Any, dict[str, Any]]:
    """The pool and the role clusters, models built: ``{"actor_train", "actor_infer"[, "reference"]}``."""
    from refimpl.worker import Cluster, ResourcePool

    pool = ResourcePool(ranks, device=device, roles=roles, cpus_per_bundle=cfg.get("cpus_per_bundle", 1.0))
    kinds = {"actor_train": ActorTrainWorker, "actor_infer": ActorInferWorker}
    if roles == 3:
        kinds["reference"] = ReferenceWorker
    wcfg = {**cfg, "device": device, "hold_reference": roles == 2}
    clusters = {name: Cluster(name, cls, pool, config=wcfg, call_timeout_s=cfg.get("call_timeout_s", 600.0))
                for name, cls in kinds.items()}
    return pool, clusters


def init_models(clusters: dict[str, Any], seed: int, generation: int) -> dict[str, int]:
    """Every role builds its model (all ranks at once); parameters per rank by role."""
    futures = {r: c.init_model(seed, generation, blocking=False) for r, c in clusters.items()}
    return {r: f.get()[0] for r, f in futures.items()}


def run_once(clusters: dict[str, Any], pcfg: Any, generation: int) -> dict[str, Any]:
    """One pipeline run on fresh models; its losses, sequences, final weight digests and per-call records."""
    from refimpl.worker.pipeline import RLVRPipeline

    for c in clusters.values():
        c.records.clear()
    params = init_models(clusters, pcfg.seed, generation)
    pipe = RLVRPipeline(clusters, pcfg)
    t0 = time.perf_counter()
    steps = pipe.run()
    wall = time.perf_counter() - t0
    life = clusters["actor_train"].lifecycle_stats()[0]  # before the digests' own weight sync
    return {"params_per_rank": params, "wall_s": wall, "phase_s": pipe.phase_s,
            "losses": [s["loss"] for s in steps], "rewards": [s["reward"] for s in steps],
            "sequences": [[t.tolist() for t in s["sequences"]] for s in steps],
            "digests": weight_digests(clusters["actor_train"]),
            "lifecycle": life,
            "calls": [_call_row(r) for c in clusters.values() for r in c.records]}


def _call_row(rec: Any) -> dict[str, Any]:
    """One call's figures: the slowest rank's phases, bytes and peak memory, the RPC time and its overhead."""
    w = rec.worst()
    m = rec.method
    row: dict[str, Any] = {"role": rec.role, "method": m, "rpc_s": rec.rpc_s, "overhead_s": rec.overhead_s()}
    for phase in ("onload", "execute", "offload", "call"):
        if f"time/{phase}/{m}" in w:
            row[f"{phase}_s"] = w[f"time/{phase}/{m}"]
    for phase in ("onload", "offload"):
        if f"bytes/{phase}/{m}" in w and row.get(f"{phase}_s"):
            row[f"{phase}_bytes"] = int(w[f"bytes/{phase}/{m}"])
            row[f"{phase}_gbps"] = w[f"bytes/{phase}/{m}"] / row[f"{phase}_s"] / 1e9
    for k, v in w.items():
        if k.startswith("memory/"):
            row[k.replace(f"/{m}", "")] = v
    return row


def summarize_calls(calls: list[dict[str, Any]], line: dict[str, float]) -> dict[str, Any]:
    """Per role and method: mean (and ``last_``) onload/offload s and GB/s, ratio to the line rate, peak memory, RPC overhead."""
    out: dict[str, Any] = {}
    for row in calls:
        key = f"{row['role']}.{row['method']}"
        agg = out.setdefault(key, {"calls": 0})
        agg["calls"] += 1
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                agg.setdefault(k, []).append(v)
    for agg in out.values():
        for k in [k for k in agg if isinstance(agg[k], list)]:
            vals = agg[k]
            if k.startswith(("onload", "offload")):
                agg[f"last_{k}"] = vals[-1]  # the steady call (the first pays for pinning the host buffers)
            agg[k] = max(vals) if k.startswith("memory/peak") else sum(vals) / len(vals)
        for phase, rate in (("onload", "h2d_gbps"), ("offload", "d2h_gbps")):
            if f"{phase}_gbps" in agg and line.get(rate):
                agg[f"{phase}_x_line"] = agg[f"{phase}_gbps"] / line[rate]
                agg[f"last_{phase}_x_line"] = agg[f"last_{phase}_gbps"] / line[rate]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of :func:`main`."""
    ap = argparse.ArgumentParser(description="A colocated RLVR pipeline, roles as Ray actors sharing the GPUs")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--ranks", type=int, default=None, help="ranks per role (default: the GPUs, or 2 on CPU)")
    ap.add_argument("--roles", type=int, choices=(2, 3), default=2,
                    help="2: actor_train (with the reference copy) + actor_infer; 3: + a reference role")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--order", default="actor_infer,reference,old_log_probs,actor_train",
                    help="the phases of a step, comma-separated (actor_infer first, actor_train last)")
    ap.add_argument("--no-offload", action="store_true", help="the baseline: every role keeps its state resident")
    ap.add_argument("--compare", action="store_true", help="also run the no-offload baseline and compare bitwise")
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="prompts per rank")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--line-mib", type=int, default=1024, help="size of the line-rate copies (CUDA)")
    ap.add_argument("--out", default=None, help="directory for ray_pipeline.json")
    return ap.parse_args(argv)


def run_all(a: argparse.Namespace, wcfg: dict[str, Any], pcfg: Any, ranks: int, device: str,
            rec: dict[str, Any]) -> int:
    """Start the roles, run the pipeline (and with ``--compare`` the baseline) into ``rec``; 3 if not bitwise equal."""
    import dataclasses

    t0 = time.perf_counter()
    _pool, clusters = build(wcfg, a.roles, ranks, device)
    rec["start_actors_s"] = time.perf_counter() - t0
    rec["config"] = {**wcfg, "order": list(pcfg.order), "offload": pcfg.offload, "steps": pcfg.steps}
    if device == "cuda":
        clusters["actor_train"].init_model(pcfg.seed, 0)
        rec["line"] = clusters["actor_train"].line_rates(a.line_mib)[0]
    run = run_once(clusters, pcfg, generation=1)
    rec["run"] = {k: v for k, v in run.items() if k != "sequences"}
    rec["summary"] = summarize_calls(run["calls"], rec.get("line", {}))
    rc = 0
    if a.compare:
        base = run_once(clusters, dataclasses.replace(pcfg, offload=not pcfg.offload), generation=2)
        rec["baseline"] = {k: v for k, v in base.items() if k not in ("sequences", "calls")}
        rec["bitwise_equal_to_baseline"] = (run["losses"] == base["losses"] and run["digests"] == base["digests"]
                                            and run["sequences"] == base["sequences"])
        rc = 0 if rec["bitwise_equal_to_baseline"] else 3
    _print_summary(rec)
    return rc


def main(argv: list[str] | None = None) -> int:
    """Start Ray, the roles, run the pipeline (and the baseline with ``--compare``), print and write the record."""
    import ray

    from refimpl.worker.pipeline import PipelineConfig

    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    ranks = a.ranks or (max(torch.cuda.device_count(), 1) if cuda else 2)
    size = dict(vocab=32000, hidden=4096, layers=8, batch=8) if cuda else dict(vocab=64, hidden=32, layers=2, batch=4)
    size.update({k: getattr(a, k) for k in size if getattr(a, k) is not None})
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    ray.init(include_dashboard=False, **({} if cuda else {"num_cpus": ranks}))
    rec: dict[str, Any] = {"device": device, "ranks_per_role": ranks, "roles": a.roles, "torch": torch.__version__,
                           "ray": ray.__version__, "ray_init_s": time.perf_counter() - t0}
    wcfg = {**size, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens}
    pcfg = PipelineConfig(steps=a.steps, batch=size["batch"], prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                          vocab=size["vocab"], order=tuple(a.order.split(",")), offload=not a.no_offload)
    try:
        rc = run_all(a, wcfg, pcfg, ranks, device, rec)
    except Exception as e:  # noqa: BLE001 - record what failed, then fail
        logger.exception("the pipeline failed")
        rec["error"] = f"{type(e).__name__}: {e}"
        rc = 1
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, "ray_pipeline.json")
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, default=str)
        print(f"ray_pipeline wrote {path}")
    ray.shutdown()
    return rc


def _print_summary(rec: dict[str, Any]) -> None:
    run = rec["run"]
    print(f"ray_pipeline: {rec['roles']} roles x {rec['ranks_per_role']} ranks on {rec['device']}, "
          f"losses {['%.6f' % x for x in run['losses']]}, rewards {['%.3f' % x for x in run['rewards']]}, "
          f"{run['wall_s']:.2f} s")
    for key, agg in rec["summary"].items():
        parts = [f"{k}={agg[k]:.4f}" for k in ("onload_s", "offload_s", "rpc_s", "overhead_s", "last_onload_x_line",
                                                 "last_offload_x_line") if k in agg]
        print(f"  {key}: calls={agg['calls']} " + " ".join(parts))
    sync = [round(t["weight_sync"], 3) for t in run.get("phase_s", []) if "weight_sync" in t]
    print(f"  weight_sync per step (s, the driver's wall time of gather + load): {sync}")
    if "bitwise_equal_to_baseline" in rec:
        print(f"  bitwise equal to the no-offload baseline: {rec['bitwise_equal_to_baseline']}")


if __name__ == "__main__":
    # the actors import the worker classes by this module's name, not as __main__ (which Ray would pickle by value)
    from bench.ray_pipeline import main as _main

    raise SystemExit(_main())
