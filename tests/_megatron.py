"""Megatron-core on Gloo in CPU processes, for the tests: a device shim and tiny models.

Megatron-core has no CPU mode: it allocates on ``torch.cuda.current_device()``, calls
``.cuda()``, creates ``torch.tensor(..., device="cuda")``, checks ``param.type()`` against
``torch.cuda.*Tensor`` names and seeds CUDA RNG trackers. :func:`cpu_shim` makes exactly those
land on the CPU, test-only, and nothing else:

* a ``TorchFunctionMode`` that rewrites every ``device=`` argument naming CUDA (``"cuda"``,
  ``"cuda:N"``, an int, a CUDA ``torch.device``) to ``"cpu"``, makes ``Tensor.cuda()`` a no-op
  and ``Tensor.to("cuda")`` stay on the CPU, and answers ``Tensor.type()`` (no argument) with the
  CUDA type name (``torch.cuda.BFloat16Tensor``), which is what Megatron's dtype checks compare;
* ``torch.cuda.current_device`` returns the CPU device (the backward pass runs outside the mode), ``synchronize``,
  ``current_stream``/``Stream``/``Event``/``stream`` are no-ops, and the RNG calls
  (``manual_seed``, ``get_rng_state``, ``set_rng_state``, and Megatron's own
  ``tensor_parallel.random._get_cuda_rng_state``/``_set_cuda_rng_state`` behind its RNG tracker)
  act on the CPU generator.

MoE's token dispatcher turns its all-to-all split sizes into host lists only for CUDA tensors
(``maybe_move_tensor_to_cpu``); the shim returns them as numpy for CPU tensors too.
On megatron-core 0.16 without TransformerEngine, ``moe_utils``'s TransformerEngine names are left
undefined (a NameError in the MoE router); the shim sets them to None, as 0.19 does itself.

Everything else is the real library: its models, DDP buffers and hooks, optimizers, parallel
state and process groups (on Gloo), collectives, bucketing, sharding and checkpoint-free training.
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode

try:
    import importlib.util

    HAVE_MEGATRON = importlib.util.find_spec("megatron.core") is not None
except (ImportError, ValueError):
    HAVE_MEGATRON = False

needs_megatron = pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core is not installed "
                                    "(pip install -e '.[megatron]')")


def _cpu_device(d):
    if isinstance(d, int) and not isinstance(d, bool):
        return "cpu"
    if isinstance(d, str) and d.startswith("cuda"):
        return "cpu"
    if isinstance(d, torch.device) and d.type == "cuda":
        return torch.device("cpu")
    return d


class _CudaToCpu(TorchFunctionMode):
    """Every CUDA device argument becomes the CPU; ``Tensor.type()`` answers with CUDA names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], *(_cpu_device(a) for a in args[1:]))
        return func(*args, **kwargs)


class _NoStream:
    """A stream/event stand-in: every call is a no-op."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: _NoStream()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_TE_FUSED = ("fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute",
             "fused_permute_with_probs", "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
             "fused_topk_with_score_function", "fused_unpermute", "te_general_gemm")


def _te_names_without_te():
    """megatron-core 0.16 without TransformerEngine leaves ``moe_utils``'s TE names undefined (0.19
    sets them to None, which is what its ``if te_general_gemm is not None`` checks expect): set them."""
    from megatron.core.transformer.moe import moe_utils

    for name in _TE_FUSED:
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def _host_splits():
    """MoE's all-to-all split sizes become host lists (numpy) only for CUDA tensors
    (``maybe_move_tensor_to_cpu``); on the CPU give ``as_numpy=True`` callers numpy too."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    orig = moe_utils.maybe_move_tensor_to_cpu

    def move(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return orig(tensor, as_numpy=as_numpy, record_stream=record_stream)

    saved = [(m, m.maybe_move_tensor_to_cpu) for m in (moe_utils, token_dispatcher)]
    for m, _ in saved:
        m.maybe_move_tensor_to_cpu = move
    return saved


@contextlib.contextmanager
def cpu_shim():
    """Run Megatron-core on the CPU inside this context (see the module docstring)."""
    cuda = torch.cuda
    patches = {
        "current_device": lambda: torch.device("cpu"),
        "synchronize": lambda *a, **k: None,
        "current_stream": lambda *a, **k: _NoStream(),
        "default_stream": lambda *a, **k: _NoStream(),
        "Stream": _NoStream,
        "Event": _NoStream,
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "device_count": lambda: 1,
    }
    saved = {k: getattr(cuda, k) for k in patches if hasattr(cuda, k)}
    for k, v in patches.items():
        setattr(cuda, k, v)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    random = rng_saved = None
    splits_saved = []
    try:
        with _CudaToCpu():
            from megatron.core.tensor_parallel import random

            rng_saved = (random._get_cuda_rng_state, random._set_cuda_rng_state)
            random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
            random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
            _te_names_without_te()
            splits_saved = _host_splits()
            yield
    finally:
        if rng_saved is not None:
            random._get_cuda_rng_state, random._set_cuda_rng_state = rng_saved
        for m, f in splits_saved:
            m.maybe_move_tensor_to_cpu = f
        for k in patches:
            if k in saved:
                setattr(cuda, k, saved[k])
            else:
                delattr(cuda, k)


# --------------------------------------------------------------------------- tiny models

VOCAB, SEQ = 64, 8


def init_parallel(ep=1):
    """Megatron's parallel state on the running (Gloo) world: TP=PP=1, expert parallel ``ep``."""
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=ep)
    return ps


def parts(dist_opt, experts=0, seed=123):
    """What a Megatron user has before wrapping: ``(config, ddp_config, opt_config, model)``, the model a
    2-layer bf16 GPTModel (MoE with ``experts`` experts, top-2, when > 0) in ``Float16Module``."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    moe = dict(num_moe_experts=experts, moe_router_topk=2, moe_token_dispatcher_type="alltoall",
               expert_model_parallel_size=parallel_state.get_expert_model_parallel_world_size(),
               moe_aux_loss_coeff=0.01, add_bias_linear=False) if experts else {}
    cfg = TransformerConfig(num_layers=2, hidden_size=16, ffn_hidden_size=32, num_attention_heads=4,
                            use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
                            pipeline_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0, **moe)
    spec = get_gpt_layer_local_spec(num_experts=experts or None, moe_grouped_gemm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ)
    model.cuda(torch.cuda.current_device())  # as Megatron's get_model does (a no-op under cpu_shim)
    ddp_cfg = DistributedDataParallelConfig(use_distributed_optimizer=dist_opt, grad_reduce_in_fp32=True,
                                            bucket_size=4096)
    opt_cfg = OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, weight_decay=0.01,
                              use_distributed_optimizer=dist_opt)
    return cfg, ddp_cfg, opt_cfg, Float16Module(cfg, model)


def build(dist_opt, experts=0, seed=123):
    """:func:`parts` in Megatron's DDP, and its optimizer from ``get_megatron_optimizer`` (Adam; distributed
    or not)."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import get_megatron_optimizer

    cfg, ddp_cfg, opt_cfg, model = parts(dist_opt, experts, seed)
    model = DistributedDataParallel(cfg, ddp_cfg, model)
    return model, get_megatron_optimizer(opt_cfg, [model])


def step(model, opt, gen, device="cpu"):
    """One training step (tokens from the CPU generator ``gen``, moved to ``device``); returns the loss."""
    model.zero_grad_buffer()
    opt.zero_grad()
    tok = torch.randint(0, VOCAB, (2, SEQ), generator=gen).to(device)
    pos = torch.arange(SEQ, device=device).unsqueeze(0).expand(2, SEQ)
    mask = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool, device=device)).logical_not().view(1, 1, SEQ, SEQ)
    loss = model(tok, pos, mask, labels=tok).float().mean()
    loss.backward()
    model.finish_grad_sync()
    ok = opt.step()
    assert (ok[0] if isinstance(ok, tuple) else ok), "the optimizer skipped a step"
    return loss.detach().cpu()


def state_bytes(model, opt):
    """Every parameter, main_grad, master weight and optimizer state tensor, as bytes, in a fixed order
    (copies: training and offloading go on after it)."""
    out = {}
    for n, p in model.named_parameters():
        out[f"param.{n}"] = p.detach().float()
        if getattr(p, "main_grad", None) is not None:
            out[f"main_grad.{n}"] = p.main_grad.detach().float()
    for j, o in enumerate(getattr(opt, "chained_optimizers", [opt])):
        k = 0
        for g in o.optimizer.param_groups:
            for m in g["params"]:
                out[f"o{j}.master.{k}"] = m.detach().float()
                for key, v in o.optimizer.state.get(m, {}).items():
                    out[f"o{j}.state.{k}.{key}"] = torch.as_tensor(v).detach().float()
                k += 1
    # a copy first: ``.numpy()`` of a tensor makes its storage non-resizable, and the store could not release it
    return {k: v.cpu().clone().numpy().tobytes() for k, v in out.items()}
