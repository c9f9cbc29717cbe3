"""The one bake loader (moebake/loading/rank_loader.py) on CPU: any runs of experts land in their rows, byte for byte
against safetensors' own reader of the files; only the asked rows are read; wrong destinations are refused."""

import pytest
import torch
from safetensors import safe_open

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import IntegrityError, InvalidArgumentError
from moebake.loading.rank_loader import BakeFiles, ExpertRun, RankLoader, rank_runs, runs_from_slots
from moebake.schema.index import read_index
from moebake.synthetic import write_gpt_oss

EXPERTS = 8


@pytest.fixture(scope="module")
def bake(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank-loader")
    source = write_gpt_oss(root / "src", num_layers=2, num_experts=EXPERTS, hidden=256, intermediate=128, vocab=64)
    return convert(source, root / "out", ConvertOptions("sm90-cutlass"), progress=False), root / "out"


def stored(out, name) -> torch.Tensor:
    """The whole tensor as safetensors itself reads it (the oracle)."""
    with safe_open(out / read_index(out).weight_map[name], framework="pt") as f:
        return f.get_tensor(name)


def empty_like_rows(record, short, rows, fill=0xA5):
    spec = record.tensors[short]
    tensor = torch.empty((rows, *spec.shape[1:]), dtype=spec.dtype.torch)
    tensor.view(torch.uint8).fill_(fill)
    return tensor


def test_rank_runs_split_evenly_or_refuse():
    assert rank_runs(8, 3, 4) == [ExpertRun(first=6, slot=0, count=2)]
    for ep_rank, ep_size in ((0, 3), (2, 2), (-1, 2), (0, 0)):
        with pytest.raises(InvalidArgumentError, match="cannot split evenly"):
            rank_runs(8, ep_rank, ep_size)


def test_runs_from_an_expert_map_join_adjacent_experts():
    #          expert: 0   1  2  3   4  5  6  7
    slots = [-1, 0, 1, 3, -1, 2, -1, 4]
    assert runs_from_slots(slots) == [
        ExpertRun(first=1, slot=0, count=2),
        ExpertRun(first=3, slot=3, count=1),
        ExpertRun(first=5, slot=2, count=1),
        ExpertRun(first=7, slot=4, count=1),
    ]
    assert runs_from_slots([-1, -1]) == []


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("slots", [[0, 1, 2, 3, 4, 5, 6, 7], [-1, -1, -1, -1, 0, 1, 2, 3], [3, -1, 0, -1, 1, -1, 2, -1]])
def test_every_run_lands_in_its_rows_and_nothing_else_is_read(bake, slots, staged):
    manifest, out = bake
    runs = runs_from_slots(slots)
    held = sum(run.count for run in runs)
    loader = RankLoader(BakeFiles(out, manifest), "cpu", chunk_bytes=4096, slots=3, staged=staged)
    per_layer = []
    for record in manifest.layers:
        destinations = {short: empty_like_rows(record, short, held) for short in record.tensors}
        stats = loader.load(record, destinations, runs)
        expected_bytes = 0
        for short, got in destinations.items():
            whole = stored(out, record.prefix + short)
            want = torch.empty_like(got)
            for expert, slot in enumerate(slots):
                if slot >= 0:
                    want[slot] = whole[expert]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), short
            expected_bytes += got.numel() * got.element_size()
        assert stats.bytes == expected_bytes  # this rank's rows only
        per_layer.append(stats.bytes)
    assert loader.total.bytes == sum(per_layer)


def test_a_tensor_named_whole_gets_every_expert(bake):
    manifest, out = bake
    record = manifest.layers[0]
    loader = RankLoader(BakeFiles(out, manifest), "cpu")
    destinations = {"w13_weight": empty_like_rows(record, "w13_weight", 2), "w2_weight": empty_like_rows(record, "w2_weight", EXPERTS)}
    loader.load(record, destinations, [ExpertRun(first=4, slot=0, count=2)], whole={"w2_weight"})
    assert torch.equal(destinations["w13_weight"], stored(out, record.prefix + "w13_weight")[4:6])
    assert torch.equal(destinations["w2_weight"], stored(out, record.prefix + "w2_weight"))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.to(torch.int8), "destination is torch.int8"),
        (lambda t: t[:1].clone(), "expected contiguous torch.uint8"),
        (lambda t: t.transpose(1, 2), "not contiguous"),
    ],
)
def test_a_destination_that_is_not_the_manifest_s_is_refused(bake, change, message):
    manifest, out = bake
    record = manifest.layers[0]
    destination = change(empty_like_rows(record, "w2_weight", 2))
    with pytest.raises(InvalidArgumentError, match=message):
        RankLoader(BakeFiles(out, manifest), "cpu").load(record, {"w2_weight": destination}, [ExpertRun(first=0, slot=0, count=2)])


def test_a_stored_tensor_that_is_not_the_manifest_s_is_refused(bake, tmp_path):
    import dataclasses

    manifest, out = bake
    record = manifest.layers[0]
    spec = record.tensors["w2_weight"]
    wrong = dataclasses.replace(record, tensors={**record.tensors, "w2_weight": dataclasses.replace(spec, shape=(EXPERTS, 1))})
    with pytest.raises(IntegrityError, match=r"tensor .*w2_weight is U8 \[.*\], the manifest says U8 \[8, 1\]"):
        RankLoader(BakeFiles(out, manifest), "cpu").load(
            wrong, {"w2_weight": torch.empty(1, 1, dtype=torch.uint8)}, [ExpertRun(first=0, slot=0, count=1)]
        )
