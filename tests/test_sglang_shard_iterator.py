"""SGLang's safetensors iterators for a bake's shards (moebake.engines.sglang.shard_iterator), in the real SGLang 0.5.23.

The oracle is SGLang's own iterators, unwrapped: for a bake, the wrapped ones hand the same names in the same order,
each tensor of the same dtype and shape and equal byte for byte, and read no page of tensor data while doing it (where
SGLang's own make the kernel read pages of every tensor). Everything else keeps SGLang's iterator.
"""

import mmap
import os
import shutil
import sys

import pytest
import torch

from moebake.formats.safetensors_file import read_header
from tests.conftest import benchkit, resident_pages

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)

from engine_oracles.sglang_oracle import plugins_loaded_for_the_module, standins, standins_hidden_after_each_test  # noqa: E402,F401  (autouse)

standins.hide()

ITERATORS = ("safetensors_weights_iterator", "buffered_multi_thread_safetensors_weights_iterator")


@pytest.fixture(scope="module")
def bake(tmp_path_factory):
    """A two-layer GPT-OSS bake, sharded (one shard per layer), with expert tensors larger than a few pages."""
    return sglang_oracle.gpt_oss_bake(
        tmp_path_factory.mktemp("shards"), num_layers=2, num_experts=8, hidden=512, intermediate=512, vocab=64
    )


def _files(directory) -> list[str]:
    return sorted(str(p) for p in directory.glob("*.safetensors"))


def _call(name: str, files: list[str], **options):
    from sglang.srt.model_loader import loader

    function = getattr(loader, name)
    if name.startswith("buffered"):
        options.setdefault("max_workers", 2)
    return function(files, **options)


def _original(name: str):
    from sglang.srt.model_loader import loader

    return getattr(getattr(loader, name), "moebake_original", None)


def _as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", ITERATORS)
def test_the_plugin_wrapped_sglangs_iterators(name):
    assert _original(name) is not None, f"the plugin did not wrap sglang.srt.model_loader.loader.{name}"


@pytest.mark.parametrize("name", ITERATORS)
def test_a_bake_gets_the_same_pairs_as_sglangs_own_iterator(bake, name):
    files = _files(bake)
    assert len(files) > 1
    ours = list(_call(name, files))
    theirs = list(_original(name)(files, **({"max_workers": 2} if name.startswith("buffered") else {})))
    assert [n for n, _ in ours] == [n for n, _ in theirs]
    for (label, mine), (_, stock) in zip(ours, theirs, strict=True):
        assert (mine.dtype, tuple(mine.shape), mine.device.type) == (stock.dtype, tuple(stock.shape), "cpu"), label
        assert _as_bytes(mine) == _as_bytes(stock), label


def _resident_data_pages(path: str) -> int:
    """Pages of ``path``'s tensor data (from the first whole page after its header) in the page cache."""
    first = -(-read_header(path).data_start // mmap.PAGESIZE)
    return resident_pages(path, first * mmap.PAGESIZE, os.path.getsize(path))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache residency through Linux mincore")
@pytest.mark.parametrize("name", ITERATORS)
def test_a_bake_is_handed_out_without_reading_its_tensors(bake, tmp_path, name):
    copy = tmp_path / "bake"
    shutil.copytree(bake, copy)
    files = _files(copy)
    benchkit().evict_from_page_cache(files)
    # reading a header (the check's, the iterator's) brings the pages after it in: the baseline
    baseline = [_resident_data_pages(path) for path in files]
    if [_resident_data_pages(path) for path in files] != baseline or sum(baseline) > len(files) * 64:
        pytest.skip("this file system keeps the files in memory (tmpfs?): no cold page cache to observe")
    pairs = list(_call(name, files))
    assert pairs and [_resident_data_pages(path) for path in files] == baseline
    del pairs
    theirs = list(_original(name)(files, **({"max_workers": 2} if name.startswith("buffered") else {})))
    touched = [_resident_data_pages(path) - before for path, before in zip(files, baseline)]
    assert all(touched), f"SGLang's own {name} read no page of tensor data here ({touched}): the check above proves nothing"
    del theirs


@pytest.mark.parametrize("options", [{"disable_mmap": True}, {"prefetch": True}, {"drop_cache_after_load": True}])
def test_sglangs_options_keep_its_own_iterator(bake, options, monkeypatch):
    from moebake.engines.sglang import shard_iterator

    monkeypatch.setattr(shard_iterator, "mapped_tensors", lambda headers: pytest.fail("mapped although SGLang was asked"))
    # one process, no server: SGLang's prefetch asks a torch.distributed world (left by another module's engine, such
    # as the vLLM plugin tests' gloo group) for its node-local rank, which only a published server context has
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert [n for n, _ in _call("safetensors_weights_iterator", _files(bake), **options)]


def test_a_checkpoint_that_is_not_a_bake_keeps_sglangs_iterator(bake, tmp_path, monkeypatch):
    from moebake.engines.sglang import shard_iterator

    plain = tmp_path / "plain"
    plain.mkdir()
    for path in _files(bake):
        shutil.copy(path, plain)
    monkeypatch.setattr(shard_iterator, "mapped_tensors", lambda headers: pytest.fail("mapped a checkpoint that is no bake"))
    assert [n for n, _ in _call("safetensors_weights_iterator", _files(plain))]
    monkeypatch.setenv("MOEBAKE_SGLANG_DIRECT_LOAD", "0")
    assert [n for n, _ in _call("safetensors_weights_iterator", _files(bake))]


@pytest.mark.parametrize("moved", ["missing", "signature"])
def test_the_iterators_refuse_in_one_line_when_sglang_moved_them(moved, monkeypatch):
    from sglang.srt.model_loader import loader

    from moebake.engines.sglang import internals, shard_iterator
    from moebake.engines.sglang.refusals import MoebakeRefusal

    if moved == "missing":
        monkeypatch.delattr(loader, "safetensors_weights_iterator")
    else:
        monkeypatch.setattr(loader, "buffered_multi_thread_safetensors_weights_iterator", lambda files, workers: iter(()))
    with pytest.raises(MoebakeRefusal) as refused:
        internals.wrap_safetensors_iterators(shard_iterator.lazy)
    assert "\n" not in str(refused.value) and "sglang.srt.model_loader.loader." in str(refused.value)


def test_wrapping_twice_wraps_once():
    from sglang.srt.model_loader import loader

    from moebake.engines.sglang import internals, shard_iterator

    before = {name: getattr(loader, name) for name in ITERATORS}
    internals.wrap_safetensors_iterators(shard_iterator.lazy)
    assert {name: getattr(loader, name) for name in ITERATORS} == before
