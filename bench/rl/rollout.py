"""The rollout role: an unsharded copy of the weights that generates into a KV cache sized to the freed memory.

The copy is built from the same config (bf16 on CUDA) and gets its weights from the weight sync
(:class:`bench.rl.weights.RolloutWeights`). Each rollout allocates its KV cache (``StaticCache`` where the
installed ``transformers`` has it, sized to take the device memory the trainer's offload gave back; else the
dynamic cache), generates with the model's own ``generate``, frees the cache, and hands its sequences to the
trainer through the host (as a single-controller framework does) as the next training batch
(:func:`next_batch`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from bench.rl.config import StepConfig

logger = logging.getLogger(__name__)


def build_rollout(mcfg: Any, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The rollout's model from ``mcfg`` on ``device`` in ``dtype``, in eval mode, no parameter needing a gradient."""
    from transformers import Qwen2ForCausalLM

    with torch.device(device):
        rollout = Qwen2ForCausalLM(mcfg).to(dtype).eval()
    for p in rollout.parameters():
        p.requires_grad_(False)
    return rollout


def generate(model, mcfg, cfg: StepConfig, device, dtype, freed: int, g) -> dict[str, Any]:
    """Generate ``new_tokens`` for ``rollout_batch`` random prompts into a KV cache sized to the freed memory.

    Returns the step record's rollout fields and, under ``_sequences``, the generated sequences."""
    prompts = torch.randint(0, mcfg.vocab_size, (cfg.rollout_batch, cfg.prompt_len), generator=g).to(device)
    per_token = 2 * mcfg.num_hidden_layers * mcfg.num_key_value_heads * (mcfg.hidden_size // mcfg.num_attention_heads) \
        * torch.empty((), dtype=dtype).element_size()
    kv_bytes = int(cfg.kv_gb * 1e9) if cfg.kv_gb is not None else max(freed, 0)
    need = cfg.prompt_len + cfg.new_tokens
    cache_len = max(need, kv_bytes // max(1, per_token * cfg.rollout_batch))
    if not cfg.tiny:
        cache_len = min(cache_len, mcfg.max_position_embeddings)
    out: dict[str, Any] = {"kv_cache_len": int(cache_len), "kv_cache_bytes_planned": int(cache_len * per_token * cfg.rollout_batch)}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    kwargs: dict[str, Any] = dict(max_new_tokens=cfg.new_tokens, min_new_tokens=cfg.new_tokens, do_sample=False,
                                  pad_token_id=0, eos_token_id=None, disable_compile=True)
    cache = _static_cache(mcfg, cfg, int(cache_len), device, dtype, out)
    with torch.no_grad():
        try:
            seq = _generate(model, prompts, cache, kwargs)
        except Exception as e:  # noqa: BLE001
            if cache is None:
                raise
            logger.warning("generate with StaticCache failed (%s); retrying with the dynamic cache", e)
            out["kv_cache"] = f"dynamic (static failed: {type(e).__name__}: {str(e)[:200]})"
            cache = None
            seq = _generate(model, prompts, None, kwargs)
    out["generated_tokens"] = int((seq.shape[1] - cfg.prompt_len) * seq.shape[0])
    if cuda:
        out["rollout_peak_extra_bytes"] = int(torch.cuda.max_memory_allocated(device) - base)
    out["_sequences"] = seq
    del cache
    return out


def _static_cache(mcfg, cfg: StepConfig, cache_len: int, device, dtype, out: dict[str, Any]):
    """A ``StaticCache`` of ``cache_len`` tokens (``out["kv_cache"]`` says which cache); None where the installed
    ``transformers`` has none (the dynamic cache still generates)."""
    try:
        from transformers import StaticCache

        try:
            cache = StaticCache(config=mcfg, max_cache_len=cache_len, max_batch_size=cfg.rollout_batch,
                                device=device, dtype=dtype)
        except TypeError:
            cache = StaticCache(config=mcfg, max_cache_len=cache_len)
        out["kv_cache"] = "static"
        return cache
    except Exception as e:  # noqa: BLE001 - older/newer transformers: the dynamic cache still generates
        logger.warning("StaticCache unavailable (%s); generating with the dynamic cache", e)
        out["kv_cache"] = f"dynamic ({type(e).__name__})"
        return None


def _generate(model, prompts: torch.Tensor, cache, kwargs: dict[str, Any]) -> torch.Tensor:
    """``model.generate`` (no automatic ``torch.compile``: it would cost more than the whole run)."""
    extra = {"past_key_values": cache} if cache is not None else {}
    try:
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), **extra, **kwargs)
    except (TypeError, ValueError) as e:
        if "disable_compile" not in str(e):
            raise
        kwargs = {k: v for k, v in kwargs.items() if k != "disable_compile"}  # an older transformers
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), **extra, **kwargs)


def next_batch(sequences: torch.Tensor, cfg: StepConfig) -> torch.Tensor:
    """The next training batch from the rollout's sequences, on the host: cut to ``batch x seq`` and, where the
    rollout made fewer or shorter ones, filled by repeating them (the training batch has a fixed shape)."""
    data = sequences[:cfg.batch, :cfg.seq].cpu()
    if data.shape[1] < cfg.seq:
        data = data.repeat(1, -(-cfg.seq // data.shape[1]))[:, :cfg.seq]
    if data.shape[0] < cfg.batch:
        data = data.repeat(-(-cfg.batch // data.shape[0]), 1)[:cfg.batch]
    return data


__all__ = ["build_rollout", "generate", "next_batch"]
