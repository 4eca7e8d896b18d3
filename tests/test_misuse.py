"""API misuse fails at the call, with a message that says what was expected and what was given.

One row per mistake a user makes with the public entry points of ``refimpl.store``, ``refimpl.worker``,
``refimpl.comm`` and the DCP checkpoint functions: a model where the runtime goes, a list among the
tensors, a bare string where a list of group names goes, an offload after ``close()``... Each row calls
the real object (no mocks) and asserts the exception type and the words of its message; nothing is moved,
started or pinned before the error.
"""
import pytest
import torch

from refimpl.arguments import ArgumentTypeError, ArgumentValueError
from refimpl.comm import LifecycleConfig, PGLifecycle
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.store import OffloadStore, StoreConfig
from refimpl.store.checkpoint import save_path, tensors_for_save
from refimpl.store.clients.ddp import attach_ddp
from refimpl.store.clients.megatron import attach_megatron
from refimpl.store.errors import StoreClosedError
from refimpl.torch_runtime import TorchRuntime, dcp
from refimpl.worker import Cluster, ResourcePool, RoleWorker, WorkerStateControl, auto_offload, state_offload_manager

RT = TorchRuntime("cpu")


def _model():
    return torch.nn.Linear(4, 2)


def _store(**kw):
    store = OffloadStore(RT, **kw)
    store.attach_module(_model(), name="model")
    return store


def _closed():
    store = _store()
    store.close()
    return store


def _control():
    return WorkerStateControl(_store())


class _Worker(RoleWorker):
    """A role's worker for the Cluster rows (never started)."""


#: (id, call, exception type, words the message must contain)
CASES = [
    # ---------------------------------------------------------------- refimpl.store
    ("store-of-a-model", lambda: OffloadStore(_model()), ArgumentTypeError,
     r"OffloadStore\(rt, \.\.\.\): rt must be a Runtime \(TorchRuntime\(device\) or SimRuntime\), got Linear; "
     r"did you mean store\.attach_module\(model\)\?"),
    ("store-of-a-device", lambda: OffloadStore("cpu"), ArgumentTypeError, r"TorchRuntime\('cpu'\)"),
    ("store-backend-not-a-name", lambda: OffloadStore(RT, backend=3), ArgumentTypeError,
     r"backend must be a non-empty str, got 3 \(int\)"),
    ("store-config-a-dict", lambda: OffloadStore(RT, config={"alignment_bytes": 512}), ArgumentTypeError,
     r"config must be a StoreConfig or None, got dict; build one: StoreConfig\(\*\*options\)"),
    ("config-int-as-str", lambda: StoreConfig(alignment_bytes="512"), ArgumentTypeError,
     r"alignment_bytes must be an int, got '512' \(str\)"),
    ("config-bool-as-str", lambda: StoreConfig(empty_cache="no"), ArgumentTypeError,
     r"empty_cache must be True or False"),
    ("config-threads-float", lambda: StoreConfig(pin_threads=2.5), ArgumentTypeError,
     r"pin_threads must be an int or None"),
    ("attach-module-optimizer", lambda: OffloadStore(RT).attach_module(torch.optim.SGD(_model().parameters(), lr=1)),
     ArgumentTypeError, r"module must be a torch\.nn\.Module, got SGD; use store\.attach_optimizer"),
    ("attach-module-name", lambda: OffloadStore(RT).attach_module(_model(), name=3), ArgumentTypeError,
     r"name must be a non-empty str"),
    ("attach-optimizer-model", lambda: OffloadStore(RT).attach_optimizer(_model()), ArgumentTypeError,
     r"optimizer must be a torch\.optim\.Optimizer, got Linear; use store\.attach_module"),
    ("attach-tensors-list-value", lambda: OffloadStore(RT).attach_tensors("params", {"x": [1, 2]}), ArgumentTypeError,
     r"tensors\['x'\] must be a torch\.Tensor \(or DTensor\), got list"),
    ("attach-tensors-not-a-mapping", lambda: OffloadStore(RT).attach_tensors("params", [torch.zeros(2)]),
     ArgumentTypeError, r"tensors must be a mapping of names to tensors"),
    ("attach-tensors-category-type", lambda: OffloadStore(RT).attach_tensors(5, {"x": torch.zeros(2)}),
     ArgumentTypeError, r"a state category must be a Category or one of \['params'"),
    ("attach-tensors-category-typo", lambda: OffloadStore(RT).attach_tensors("param", {"x": torch.zeros(2)}),
     ValueError, r"unknown state category 'param'"),
    ("attach-tensors-flag", lambda: OffloadStore(RT).attach_tensors("params", {"x": torch.zeros(2)},
                                                                     host_resident_ok="yes"),
     ArgumentTypeError, r"host_resident_ok must be True or False"),
    ("offload-include-int", lambda: _store().offload(include=5), ArgumentTypeError,
     r"include must be a category \('params'.*got 5 \(int\)"),
    ("offload-drop-grads-str", lambda: _store().offload(drop_grads="yes"), ArgumentTypeError,
     r"drop_grads must be True or False"),
    ("reload-include-float", lambda: _store().reload(include=3.0), ArgumentTypeError, r"include must be"),
    ("reload-local-only-str", lambda: _store().reload(local_only="yes"), ArgumentTypeError,
     r"local_only must be True or False"),
    ("offload-after-close", lambda: _closed().offload(), StoreClosedError,
     r"offload on a closed OffloadStore.*make a new OffloadStore"),
    ("reload-after-close", lambda: _closed().reload(), StoreClosedError, r"reload on a closed OffloadStore"),
    ("attach-after-close", lambda: _closed().attach_module(_model(), name="m2"), StoreClosedError, r"closed"),
    ("ddp-of-a-plain-model", lambda: attach_ddp(OffloadStore(RT), _model()), ArgumentTypeError,
     r"ddp must be a torch DistributedDataParallel, got Linear; wrap it in DistributedDataParallel"),
    ("ddp-store-a-model", lambda: attach_ddp(_model(), _model()), ArgumentTypeError,
     r"store must be an OffloadStore, got Linear; build the store first"),
    ("megatron-store-a-model", lambda: attach_megatron(_model(), _model()), ArgumentTypeError,
     r"attach_megatron\(.*store must be an OffloadStore"),
    # ---------------------------------------------------------------- checkpoints
    ("save-path-of-a-model", lambda: save_path(_model()), ArgumentTypeError, r"store must be an OffloadStore"),
    ("tensors-for-save-of-a-model", lambda: tensors_for_save(_model()), ArgumentTypeError,
     r"store must be an OffloadStore"),
    ("save-without-a-path", lambda: dcp.save(_store()), ArgumentValueError, r"give checkpoint_id"),
    ("save-path-an-int", lambda: dcp.save(_store(), 42), ArgumentTypeError, r"checkpoint_id must be a path"),
    ("save-checksums-str", lambda: dcp.save(_store(), "/nonexistent/x", checksums="on"), ArgumentTypeError,
     r"checksums must be True or False"),
    ("load-into-a-model", lambda: dcp.load_into(_model(), "/nonexistent/x"), ArgumentTypeError,
     r"state_dict must be a dict .*pass model\.state_dict\(\) inside a dict"),
    ("load-without-a-path", lambda: dcp.load_into({}), ArgumentValueError, r"give checkpoint_id"),
    ("load-verify-str", lambda: dcp.load_into({}, "/nonexistent/x", verify="no"), ArgumentTypeError,
     r"verify must be True or False"),
    # ---------------------------------------------------------------- refimpl.worker
    ("control-of-a-model", lambda: WorkerStateControl(_model()), ArgumentTypeError,
     r"WorkerStateControl needs an OffloadStore .*got Linear"),
    ("control-include-typo", lambda: WorkerStateControl(_store(), include="param"), ValueError,
     r"unknown state category 'param'"),
    ("control-drop-grads-str", lambda: WorkerStateControl(_store(), drop_grads="no"), ArgumentTypeError,
     r"drop_grads must be True or False"),
    ("control-lifecycle-wrong", lambda: WorkerStateControl(_store(), lifecycle=object()), ArgumentTypeError,
     r"lifecycle must be a PGLifecycle or None, got object"),
    ("manager-of-a-store", lambda: state_offload_manager(_store()), ArgumentTypeError,
     r"control must be a WorkerStateControl, got OffloadStore; wrap the store"),
    ("manager-metrics-list", lambda: state_offload_manager(_control(), metrics=[]), ArgumentTypeError,
     r"metrics must be a dict or None"),
    ("manager-flag-str", lambda: state_offload_manager(_control(), is_offload_states="false"), ArgumentTypeError,
     r"is_offload_states must be True or False"),
    ("auto-offload-name-as-method", lambda: auto_offload("ctl"), ArgumentTypeError,
     r"@auto_offload\(control='ctl'\)"),
    ("cluster-pool-wrong", lambda: Cluster("actor", _Worker, pool=object()), ArgumentTypeError,
     r"pool must be a ResourcePool, got object"),
    ("cluster-role-empty", lambda: Cluster("", _Worker, pool=object()), ArgumentValueError,
     r"role must be a non-empty str"),
    ("pool-size-str", lambda: ResourcePool("2", device="cpu"), ArgumentTypeError, r"world_size must be an int >= 1"),
    ("role-worker-rank-str", lambda: RoleWorker("actor", "0", 1), ArgumentTypeError, r"rank must be an int >= 0"),
    ("role-worker-config-list", lambda: RoleWorker("actor", 0, 1, "127.0.0.1", 1234, config=[1]),
     ArgumentTypeError, r"config must be a mapping or None"),
    # ---------------------------------------------------------------- refimpl.comm
    ("lifecycle-of-a-model", lambda: PGLifecycle(_model(), ["dp"]), ArgumentTypeError,
     r"rt must be a Runtime .*got Linear"),
    ("lifecycle-groups-a-string", lambda: PGLifecycle(RT, "dp"), ArgumentTypeError,
     r"groups must be a collection of group names .*got 'dp' \(str\); wrap a single group in a list: \['dp'\]"),
    ("lifecycle-group-an-int", lambda: PGLifecycle(RT, ["dp", 3]), ArgumentTypeError,
     r"every element of groups must be a group name \(str\) or a GroupSpec, got 3 \(int\)"),
    ("lifecycle-config-a-dict", lambda: PGLifecycle(RT, ["dp"], config={"cooldown_s": 0}), ArgumentTypeError,
     r"build one: LifecycleConfig\(\*\*options\)"),
    ("lifecycle-gate-a-function", lambda: PGLifecycle(RT, ["dp"], gates=[lambda ctx: True]), ArgumentTypeError,
     r"every element of gates must be a Gate"),
    ("lifecycle-resident-a-string", lambda: PGLifecycle(RT, ["dp"], resident="wsync"), ArgumentTypeError,
     r"resident must be a collection of names"),
    ("lifecycle-plan-a-dict", lambda: PGLifecycle(RT, ["dp"], plan={"keep_live": ["dp"]}), ArgumentTypeError,
     r"plan must be a GroupPlanRules or None, got dict"),
    ("lifecycle-config-seconds-str", lambda: LifecycleConfig(cooldown_s="2"), ArgumentTypeError,
     r"cooldown_s must be a number, got '2' \(str\)"),
    ("lifecycle-config-flag-str", lambda: LifecycleConfig(two_phase="yes"), ArgumentTypeError,
     r"two_phase must be True or False"),
    ("lifecycle-config-retries-float", lambda: LifecycleConfig(rebuild_retries=1.5), ArgumentTypeError,
     r"rebuild_retries must be an int"),
    ("plan-rules-name-an-int", lambda: GroupPlanRules(keep_live=[1]), ArgumentTypeError,
     r"every element of keep_live must be a str, got 1 \(int\)"),
    ("plan-rules-bytes-str", lambda: GroupPlanRules(keep_below_bytes="1M"), ArgumentTypeError,
     r"keep_below_bytes must be an int"),
    ("plan-rules-costs-wrong", lambda: GroupPlanRules(costs=5), ArgumentTypeError,
     r"costs must be a SwitchCosts or None"),
]


@pytest.mark.parametrize("call,error,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_misuse_fails_at_the_call_saying_what_was_expected(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_closed_store_can_be_closed_again_and_still_reports_its_stats():
    store = _closed()
    store.close()
    assert store.stats().offloaded == ()
