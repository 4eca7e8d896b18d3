"""The model shapes the simulator and the benchmark move: a sharded model adds up to the whole model, and a preset's
constants read back in the units their files were written in."""
from __future__ import annotations

import math

import pytest

from refimpl.store import Category
from sim.presets import ConstantTable, list_calibrated, list_presets, load_preset_data
from sim.presets.bench_shapes import dense_shape, moe_shape
from sim.presets.models import ARCHITECTURES, ModelConfig, build_state

#: published parameter counts of the presets' models (their Hugging Face configs)
PUBLISHED = {"dense-7b": 6_738_415_616, "qwen3-4b": 4_022_468_096, "moe-30b-a3b": 30_532_122_624}


def _params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {t.name: t.shape for t in build_state(cfg) if t.category == "params"}


@pytest.mark.parametrize("preset", sorted(ARCHITECTURES))
def test_a_presets_parameters_are_the_published_model(preset):
    whole = _params(ModelConfig(preset=preset, state=("params",)))
    assert sum(math.prod(s) for s in whole.values()) == PUBLISHED[preset]


@pytest.mark.parametrize("split", [{"fsdp": 3}, {"fsdp": 7}, {"tp": 3}])
def test_every_shard_of_a_split_model_covers_its_share_of_each_tensor(split):
    """A dimension that does not divide is padded, as FSDP2 and Megatron pad it: ``parts`` shards of a tensor hold at
    least the whole tensor and less than one row per shard more, so the shards of every rank add up to the model."""
    parts = next(iter(split.values()))
    whole = _params(ModelConfig(preset="dense-7b", state=("params",)))
    shard = _params(ModelConfig(preset="dense-7b", state=("params",), **split))
    assert shard.keys() == whole.keys()
    for name, full in whole.items():
        mine = shard[name]
        dim = next((d for d, (a, b) in enumerate(zip(full, mine)) if a != b), None)
        if dim is None:  # a tensor tp leaves whole (norms)
            continue
        row = math.prod(full) // full[dim]
        assert full[dim] <= parts * mine[dim] < full[dim] + parts, (name, full, mine)
        assert math.prod(full) <= parts * math.prod(mine) < math.prod(full) + parts * row


@pytest.mark.parametrize("shape", [dense_shape, moe_shape])
def test_the_benchmarks_shards_cover_the_whole_parameter(shape):
    """``timeshare bench offload`` moves one rank's FSDP shard of each parameter: with a shard count that does not
    divide the rows, the shard is padded (never short), so ``shards`` shards hold every row."""
    def params(shards):
        return {t.name: t.numel for t in shape(shards=shards, tiny=True).tensors if t.category is Category.PARAMS}

    whole = params(1)
    for shards in (3, 7):
        local = params(shards)
        assert local.keys() == whole.keys()
        for name, n in whole.items():
            assert local[name] * shards >= n, (shards, name, local[name], n)
    assert shape(shards=1, tiny=True).nbytes == 14 * sum(whole.values())  # bf16 params, fp32 master and two moments


def test_the_full_size_benchmark_shape_is_llama_2_7b():
    params = [t for t in dense_shape(shards=1).tensors if t.category is Category.PARAMS]
    assert sum(t.numel for t in params) == PUBLISHED["dense-7b"]


@pytest.mark.parametrize("name", [*list_presets(), *list_calibrated()])
def test_a_presets_constants_read_back_in_the_units_they_were_written_in(name):
    """The SI value a model uses is the written value times its unit; the topology's summary (what a user reads
    back) gives the written value again in its written unit."""
    from sim.machine.topology import Topology

    raw = load_preset_data(name)["constants"]
    summary = Topology.from_preset(name).summary()["constants"]
    for key, c in raw.items():
        assert summary[key]["unit"] == c["unit"]
        assert summary[key]["value"] == pytest.approx(c["value"], rel=1e-12), (name, key)


def test_a_constant_is_kept_in_si_units_and_written_back_in_its_own():
    table = ConstantTable({"hbm": {"value": 141, "unit": "GB", "source": "a datasheet figure"},
                           "link": {"value": 2, "unit": "GiB", "source": "an assumption for this test"},
                           "lat": {"value": 5, "unit": "us", "source": "an assumption for this test"}}, "test")
    assert table.by_name["hbm"].value == 141e9 and table.by_name["hbm"].as_written == pytest.approx(141)
    assert table.by_name["link"].value == 2 * 2**30 and table.by_name["link"].as_written == pytest.approx(2)
    assert table.by_name["lat"].value == pytest.approx(5e-6) and table.by_name["lat"].as_written == pytest.approx(5)
