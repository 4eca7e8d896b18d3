"""``refimpl.integrations.verl.patch()``: verl's workers call the drop-ins, and what reads offloaded state loads it.

In spawned processes (the patch changes verl's modules process-wide): which names are rebound (the
defining modules, verl's engines that import them by name, and a module of the user's that did the
same), that ``unpatch`` puts every original back, that ``VERL_USE_EXTERNAL_MODULES`` patches a process
at ``import verl``, and that verl's FSDP engine's weight export (``get_per_tensor_param``, which reads
FSDP2 parameters while they are offloaded) gives the same tensors after a drop-in offload as after verl's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from tests._dist import run_distributed
from tests.integrations._verl import needs_verl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _patch_and_unpatch(rank, world):
    import importlib

    from verl.utils import fsdp_utils
    from verl.utils.fsdp_utils import offload_fsdp_model_to_cpu as imported_by_user  # a user's module does this

    import refimpl.integrations.verl as tv

    names = {n: getattr(fsdp_utils, n) for n in tv.FSDP_FUNCTIONS}
    user = type(sys)("user_worker")
    user.offload_fsdp_model_to_cpu = imported_by_user
    sys.modules["user_worker"] = user
    p = tv.patch()
    assert tv.patch() is p, "a second patch() returns the active one"
    engine = importlib.import_module("verl.workers.engine.fsdp.transformer_impl")
    mega = importlib.import_module("verl.workers.engine.megatron.transformer_impl")
    during = {
        "fsdp_utils": all(getattr(fsdp_utils, n) is f for n, f in tv.FSDP_FUNCTIONS.items()),
        "engine": engine.offload_fsdp_model_to_cpu is tv.offload_fsdp_model_to_cpu
        and engine.load_fsdp_optimizer is tv.load_fsdp_optimizer,
        "megatron": mega.offload_megatron_model_to_cpu is tv.offload_megatron_model_to_cpu
        and mega.load_megatron_optimizer is tv.load_megatron_optimizer,
        "user": user.offload_fsdp_model_to_cpu is tv.offload_fsdp_model_to_cpu,
        "wrapped": sorted(p.wrapped), "skipped": sorted(p.skipped), "rebound": len(p.rebound),
    }
    assert tv.unpatch() and not tv.unpatch()
    after = {
        "fsdp_utils": all(getattr(fsdp_utils, n) is names[n] for n in tv.FSDP_FUNCTIONS),
        "engine": engine.offload_fsdp_model_to_cpu is names["offload_fsdp_model_to_cpu"],
        "user": user.offload_fsdp_model_to_cpu is imported_by_user,
        "methods": all(not hasattr(engine.FSDPEngine.__dict__[m], "__wrapped__")
                       for m in ("get_per_tensor_param", "save_checkpoint")),
    }
    return during, after


@needs_verl
def test_patch_rebinds_every_importer_and_unpatch_restores_them():
    (during, after), = run_distributed(_patch_and_unpatch, 1, timeout=200)
    assert during["fsdp_utils"] and during["engine"] and during["user"], during
    assert "FSDPEngine.get_per_tensor_param" in during["wrapped"] and "FSDPEngine.save_checkpoint" in during["wrapped"]
    if "verl.workers.engine.megatron.transformer_impl" not in during["skipped"]:  # megatron-core installed
        assert during["megatron"] and "MegatronEngine.initialize" in during["wrapped"], during
    # 6 FSDP names in fsdp_utils and in 2 engines (+ the user's module), 6 Megatron names in 2 modules
    assert during["rebound"] >= 6 + 4 + 1, during
    assert all(after.values()), after


@needs_verl
def test_environment_variable_patches_at_import_verl():
    code = textwrap.dedent("""
        import verl
        from verl.utils import fsdp_utils
        import refimpl.integrations.verl as tv
        assert fsdp_utils.offload_fsdp_model_to_cpu is tv.offload_fsdp_model_to_cpu
        assert tv.active_patch() is not None
        print("patched")
    """)
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="refimpl.integrations.verl_autopatch", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "patched" in out.stdout, out.stderr[-3000:]


def _export(rank, world, family):
    """verl's FSDPEngine.get_per_tensor_param on an offloaded FSDP2 model, as verl's naive weight sync calls it."""
    from types import SimpleNamespace

    from refimpl.integrations.verl_platform import use_cpu_platform
    from tests.integrations.test_verl_fsdp import _model_and_optimizer

    use_cpu_platform()
    import refimpl.integrations.verl as tv
    from refimpl.store import OffloadedTensorError
    from verl.utils import fsdp_utils
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    model, opt = _model_and_optimizer()
    model(torch.zeros(2, 3, dtype=torch.long)).sum().backward()
    opt.step()
    engine = object.__new__(FSDPEngineWithLMHead)  # the real class and method; only the attributes it reads set
    engine.__dict__.update(module=model, optimizer=opt, _uses_fsdp2_cpu_offload_policy=False, _is_offload_param=True,
                           _qat_enabled=False, model_config=SimpleNamespace(lora={}, hf_config=SimpleNamespace(
                               model_type="llama")))
    unpatched_error = None
    if family == "verl":
        fsdp_utils.offload_fsdp_model_to_cpu(model)
    else:
        tv.offload_fsdp_model_to_cpu(model)
        try:
            dict(engine.get_per_tensor_param()[0])
        except OffloadedTensorError as e:
            unpatched_error = str(e)
        tv.patch()
    params = {k: v.detach().reshape(-1).view(torch.int32).tolist() for k, v in engine.get_per_tensor_param()[0]}
    offloaded = tv.store_of(model).is_offloaded("params") if family == "store" else None
    tv.unpatch()
    return params, unpatched_error, offloaded


@needs_verl
def test_weight_export_reads_the_same_tensors_after_a_drop_in_offload():
    (verl_params, _, _), = run_distributed(_export, 1, args=("verl",), timeout=200)
    (store_params, unpatched_error, offloaded), = run_distributed(_export, 1, args=("store",), timeout=200)
    assert unpatched_error and "reload() first" in unpatched_error, "without the patch the export must refuse"
    assert len(verl_params) == 5 and store_params == verl_params  # Embedding, 2 x Linear (weight, bias)
    assert offloaded is False, "the export loaded the model; verl's update_weights offloads it afterwards"
