"""A bake's non-expert tensors through moebake's loader in the real SGLang 0.5.23, on CPU.

The oracle is SGLang's own path: its safetensors iterator (lazy mmap'd views) and its parameters' loaders
(``default_weight_loader``, ``VocabParallelEmbedding``'s, ``ReplicatedLinear``'s) or its GPT-OSS ``load_weights``
and ``DefaultModelLoader.load_weights_and_postprocess``. Every parameter loaded with the filter must equal, byte for
byte, what SGLang's path alone gives; the tensors moebake reads must never be read through SGLang's views. The
vocabulary layers also at every rank of TP 2 and 4 (each rank's rows and zeroed padding rows).
"""

import json
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from conftest import assert_parameters_equal, load_all

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)


from engine_oracles.sglang_oracle import plugins_loaded_for_the_module, standins, standins_hidden_after_each_test  # noqa: E402,F401  (autouse)

standins.hide()

CPU = torch.device("cpu")
EXPERTS = "model.layers.0.mlp.experts."


@pytest.fixture(scope="module")
def bake(tmp_path_factory):
    """A one-layer GPT-OSS bake whose vocabulary (64) SGLang does not pad, so its embeddings are plain copies."""
    return sglang_oracle.gpt_oss_bake(tmp_path_factory.mktemp("whole"), num_layers=1, num_experts=4, hidden=160, intermediate=96, vocab=64)


@contextmanager
def serving(out):
    with (
        sglang_oracle.sglang_engine(moe_runner_backend="flashinfer_mxfp4", gpu="sm90"),
        mock.patch("moebake.engines.sglang.config.model_directory", return_value=out),
        mock.patch("sglang.srt.layers.quantization.mxfp4._FI_HAS_SM90_CUTLASS_MXFP4", True),
    ):
        yield


def sglang_weights(out):
    """SGLang's own iterator over the bake's shards: ``(name, lazy mmap'd view)``."""
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    return safetensors_weights_iterator(sorted(str(p) for p in out.glob("*.safetensors")))


def sglang_load(holder: torch.nn.Module, weights) -> None:
    """What SGLang's models do with a name that is a parameter's: ``getattr(param, "weight_loader",
    default_weight_loader)(param, tensor)``; names no parameter has are skipped."""
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    params = dict(holder.named_parameters())
    for name, tensor in weights:
        if name in params:
            getattr(params[name], "weight_loader", default_weight_loader)(params[name], tensor)


class _Module(torch.nn.Module):
    pass


def _place(root: torch.nn.Module, dotted: str, module: torch.nn.Module) -> None:
    *path, leaf = dotted.split(".")
    for part in path:
        if not hasattr(root, part):
            root.add_module(part, _Module())
        root = getattr(root, part)
    root.add_module(leaf, module)


def holder(files: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Parameters at the bake's non-expert names, filled with a pattern no checkpoint has: the embeddings and the
    head as SGLang's ``VocabParallelEmbedding`` / ``ParallelLMHead`` (``padded`` rows: 64 fits, 128 pads), the router
    as its ``ReplicatedLinear``, every other one a bare parameter with ``default_weight_loader`` (norms in bf16, the
    stored float32 converted by SGLang's copy), ``sinks`` with none, ``q_proj.weight`` with another loader."""
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    root = _Module()
    vocab, hidden = files["model.embed_tokens.weight"].shape
    with torch.device(CPU):
        _place(root, "model.embed_tokens", VocabParallelEmbedding(vocab, hidden, params_dtype=torch.bfloat16))
        _place(root, "lm_head", ParallelLMHead(vocab, hidden, params_dtype=torch.bfloat16, padding_size=128))
        router = files["model.layers.0.mlp.router.weight"]
        _place(
            root, "model.layers.0.mlp.router", ReplicatedLinear(router.shape[1], router.shape[0], bias=True, params_dtype=torch.bfloat16)
        )
    for name, tensor in files.items():
        module_name, leaf = name.rsplit(".", 1)
        if name.startswith(EXPERTS) or name in dict(root.named_parameters()):
            continue
        dtype = torch.bfloat16 if "norm" in name else tensor.dtype
        param = torch.nn.Parameter(torch.empty(tensor.shape, dtype=dtype), requires_grad=False)
        if name.endswith("q_proj.weight"):
            param.weight_loader = lambda p, w: p.data.copy_(w.flip(0))  # not a plain copy
        elif not name.endswith("sinks"):
            param.weight_loader = default_weight_loader
        if not any(n == module_name for n, _ in root.named_modules()):
            _place(root, module_name, _Module())
        root.get_submodule(module_name).register_parameter(leaf, param)
    for param in root.parameters():
        param.data.reshape(-1).view(torch.uint8).fill_(0xA5)
    return root


DIRECT = {
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.layers.0.mlp.router.weight",
    "model.layers.0.mlp.router.bias",
    "model.layers.0.self_attn.sinks",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.k_proj.bias",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.v_proj.bias",
    "model.layers.0.self_attn.q_proj.bias",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.self_attn.o_proj.bias",
}
"""The holder's parameters SGLang fills by a plain full copy of a tensor of their own shape and dtype, and the head
(its 64 rows into the first 64 of 128, the other 64 zeroed)."""


def test_filtered_parameters_equal_sglangs_own_loading_byte_for_byte(bake):
    from moebake.engines.sglang.whole_model import DirectParameterLoader

    files = load_all(bake)
    with serving(bake):
        stock, ours = holder(files), holder(files)
        sglang_load(stock, sglang_weights(bake))
        loader = DirectParameterLoader(ours, bake, CPU, staged=True, chunk_bytes=4096, slots=3, batch_bytes=10_000)
        calls, read = [], loader.reader.read

        def counted(ranges):  # what each of the reader's read calls was asked for
            calls.append(sum(piece.dest.numel() for piece in ranges))
            return read(ranges)

        loader.reader.read = counted
        sglang_load(ours, loader.filter(sglang_weights(bake)))
    checked = assert_parameters_equal(ours, stock, "SGLang's own loading")
    assert len(checked) == len(files) - 6  # every non-expert tensor has its parameter
    stats = loader.stats
    assert stats.finished and set(stats.loaded) == DIRECT
    assert set(stats.passed) == set(files) - DIRECT
    assert stats.loaded_bytes == sum(files[n].numel() * files[n].element_size() for n in DIRECT)
    assert stats.zeroed_bytes == 64 * files["lm_head.weight"].shape[1] * 2  # the head's 64 padding rows, bf16
    assert stats.passed_bytes == sum(t.numel() * t.element_size() for n, t in files.items() if n not in DIRECT)
    sizes = [size for _, size in stats.batches]  # a read call each time 10,000 bytes were pending, then the rest
    assert len(sizes) >= 2 and all(size >= 10_000 for size in sizes[:-1]) and sum(sizes) == stats.loaded_bytes
    assert sizes == calls and all(seconds > 0 for seconds, _ in stats.batches)  # a batch is one read call, timed


def test_other_loaders_shapes_and_dtypes_pass_through_untouched(bake):
    """The q projection's own loader, the bf16 norms of float32 tensors and every baked expert tensor are yielded as
    SGLang's iterator gave them (the same objects)."""
    from moebake.engines.sglang.whole_model import DirectParameterLoader

    files = load_all(bake)
    with serving(bake):
        ours = holder(files)
        given = dict(sglang_weights(bake))
        yielded = dict(DirectParameterLoader(ours, bake, CPU).filter(iter(given.items())))
    kept = {
        "model.layers.0.self_attn.q_proj.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
    }
    assert kept | {n for n in files if n.startswith(EXPERTS)} == set(yielded)
    assert all(yielded[name] is given[name] for name in yielded)


class Watched(torch.Tensor):
    """A view of SGLang's lazy tensor that records every operation on it other than reading its metadata."""

    touched: list[str] = []
    METADATA = {"shape", "dtype", "device", "is_meta", "requires_grad"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        getter = getattr(getattr(func, "__self__", None), "__name__", None)
        if not (getattr(func, "__name__", "") == "__get__" and getter in cls.METADATA):
            for arg in list(args) + list((kwargs or {}).values()):
                if isinstance(arg, Watched) and hasattr(arg, "watched_name"):
                    cls.touched.append(arg.watched_name)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def watched(weights):
    for name, tensor in weights:
        view = tensor.as_subclass(Watched)
        view.watched_name = name
        yield name, view


def test_the_tensors_moebake_reads_are_never_read_through_sglangs_views(bake):
    from moebake.engines.sglang.whole_model import DirectParameterLoader

    files = load_all(bake)
    Watched.touched = []
    with serving(bake):
        ours = holder(files)
        loader = DirectParameterLoader(ours, bake, CPU)
        sglang_load(ours, loader.filter(watched(sglang_weights(bake))))
    assert set(loader.stats.loaded) == DIRECT
    assert not DIRECT & set(Watched.touched)
    assert "model.norm.weight" in Watched.touched  # the watch sees a copy SGLang makes


def _groups_written(monkeypatch) -> None:
    """The process's model-parallel groups stated in SGLang's parallel context, as a one-rank server without DP attention
    has them: :func:`sglang_oracle.sglang_engine` builds the groups once per process, so after an earlier use reset the
    context they are only in ``parallel_state``; releases before 0.5.20 keep the attention-DP rank and size in
    ``dp_attention``'s globals (``initialize_dp_attention``, which a server runs and the oracle does not)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import dp_attention
    from sglang.srt.runtime_context import get_parallel

    try:
        get_parallel().pp_group
    except RuntimeError:
        sglang_oracle.override_parallel(pp_group=parallel_state._PP)
    if getattr(dp_attention, "_ATTN_DP_SIZE", 1) is None:
        monkeypatch.setattr(dp_attention, "_ATTN_DP_SIZE", 1)
        monkeypatch.setattr(dp_attention, "_ATTN_DP_RANK", 0)
        try:
            get_parallel().attn_dp_size
        except RuntimeError:
            sglang_oracle.override_parallel(attn_dp_size=1, attn_dp_rank=0)


def _gpt_oss_model(out, monkeypatch):
    """SGLang's whole ``GptOssForCausalLM`` of the bake, as its loader builds it (bf16 default dtype), on CPU."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.models.gpt_oss import GptOssForCausalLM

    _groups_written(monkeypatch)
    quant = QUANTIZATION_METHODS["moebake"].from_config(json.loads((out / "config.json").read_text())["quantization_config"])
    with set_default_torch_dtype(torch.bfloat16), CPU:
        model = GptOssForCausalLM(ModelConfig(str(out)).hf_config, quant_config=quant)
    for param in model.parameters():
        param.data.reshape(-1).view(torch.uint8).fill_(0x5A)
    return model


def test_sglangs_gpt_oss_loader_intercepted_equals_sglangs_own(bake, monkeypatch):
    """``DefaultModelLoader.load_weights_and_postprocess`` (moebake's wrapper, installed by the plugin's entry point)
    loads SGLang's GPT-OSS model byte for byte as SGLang's own function does; the embeddings, head, router and sinks
    are read by moebake; a second call (``update_weights_from_disk``) keeps SGLang's path."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    intercepted = DefaultModelLoader.load_weights_and_postprocess
    original = intercepted.moebake_original
    with serving(bake):
        stock, ours = _gpt_oss_model(bake, monkeypatch), _gpt_oss_model(bake, monkeypatch)
        original(stock, sglang_weights(bake), CPU)
        intercepted(ours, sglang_weights(bake), CPU)
        assert_parameters_equal(ours, stock, "SGLang's own load_weights_and_postprocess")
        assert set(ours.moebake_direct_load.stats.loaded) == {
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.layers.0.mlp.router.weight",
            "model.layers.0.mlp.router.bias",
            "model.layers.0.self_attn.sinks",
        }
        first = ours.moebake_direct_load
        assert first.reader is ours.quant_config.rank_loader(torch.device("cpu")).reader  # one ring, one thread pool
        intercepted(ours, sglang_weights(bake), CPU)
        assert ours.moebake_direct_load is first


@pytest.mark.parametrize("moved", ["missing", "signature", "not static"])
def test_the_interception_refuses_in_one_line_when_sglang_moved_the_function(bake, monkeypatch, moved):
    from sglang.srt.model_loader.loader import DefaultModelLoader

    from moebake.engines.sglang import internals, loader_hook, whole_model
    from moebake.engines.sglang.refusals import MoebakeRefusal

    if moved == "missing":
        monkeypatch.delattr(DefaultModelLoader, "load_weights_and_postprocess")
    elif moved == "signature":
        monkeypatch.setattr(DefaultModelLoader, "load_weights_and_postprocess", staticmethod(lambda model, weights: None))
    else:
        monkeypatch.setattr(DefaultModelLoader, "load_weights_and_postprocess", lambda self, model, weights, device: None)
    with pytest.raises(MoebakeRefusal) as refused:
        internals.wrap_load_weights_and_postprocess(whole_model.intercept)
    message = str(refused.value)
    assert "\n" not in message and "DefaultModelLoader.load_weights_and_postprocess" in message
    monkeypatch.setattr(loader_hook, "_install_problem", None)
    loader_hook.install(whole_model.intercept)
    with serving(bake), pytest.raises(MoebakeRefusal, match="load_weights_and_postprocess"):
        from sglang.srt.layers.quantization import QUANTIZATION_METHODS

        QUANTIZATION_METHODS["moebake"].from_config(json.loads((bake / "config.json").read_text())["quantization_config"])
    monkeypatch.undo()
    loader_hook.install(whole_model.intercept)
    loader_hook.check_installed()  # back to SGLang's function: installed (once), nothing refused


VOCAB, HIDDEN = 130, 48
"""A vocabulary no padding divides: padded to 192 (SGLang's default 64) or 256 (the head's 128), so at TP 2 and 4
every rank's shard ends in padding rows, and at TP 4 the head's rank 3 holds padding only (rows 128..130 are
rank 2's)."""
VOCAB_NAMES = ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias")


@pytest.fixture(scope="module")
def vocab_checkpoint(tmp_path_factory):
    """``model.safetensors`` of bf16 ``[130, 48]`` embeddings and head and a ``[130]`` head bias, no value zero."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("vocab")
    generator = torch.Generator().manual_seed(7)
    tensors = {
        name: (torch.rand((VOCAB, HIDDEN)[: 2 if name.endswith("weight") else 1], generator=generator) + 0.5).to(torch.bfloat16)
        for name in VOCAB_NAMES
    }
    save_file(tensors, str(root / "model.safetensors"))
    return root


def tensor_parallel(tp: int, rank: int) -> None:
    """SGLang's parallel context as TP (= EP) rank ``rank`` of ``tp`` has it. The oracle's world is one process, so
    the TP, attention-TP and EP groups are stand-ins of ``tp`` ranks (releases from 0.5.21 check the groups' widths
    where they can read them); building and loading the vocabulary layers never communicates."""
    from types import SimpleNamespace

    group = SimpleNamespace(world_size=tp, rank_in_group=rank)
    sglang_oracle.override_parallel(
        tp_size=tp,
        tp_rank=rank,
        attn_tp_size=tp,
        attn_tp_rank=rank,
        moe_ep_size=tp,
        moe_ep_rank=rank,
        tp_group=group,
        attn_tp_group=group,
        moe_ep_group=group,
    )


def vocab_holder(tp: int, rank: int) -> torch.nn.Module:
    """SGLang's ``VocabParallelEmbedding`` and ``ParallelLMHead`` (with a bias, padded to 128) as TP rank ``rank`` of
    ``tp`` builds them, every byte of their parameters 0xA5."""
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    tensor_parallel(tp, rank)
    root = _Module()
    with torch.device(CPU):
        _place(root, "model.embed_tokens", VocabParallelEmbedding(VOCAB, HIDDEN, params_dtype=torch.bfloat16))
        _place(root, "lm_head", ParallelLMHead(VOCAB, HIDDEN, bias=True, params_dtype=torch.bfloat16, padding_size=128))
    for param in root.parameters():
        param.data.reshape(-1).view(torch.uint8).fill_(0xA5)
    return root


def rank_rows(padding: int, tp: int, rank: int) -> tuple[int, int, int]:
    """``(first, end, parameter rows)``: the vocabulary rows TP rank ``rank`` of ``tp`` holds, by the layout SGLang's
    class docstring draws (the padded vocabulary cut into ``tp`` equal parts, the rows past the vocabulary padding)."""
    per_rank = -(-VOCAB // padding) * padding // tp
    first = min(rank * per_rank, VOCAB)
    return first, min(first + per_rank, VOCAB), per_rank


@pytest.mark.parametrize("tp", [2, 4])
def test_each_tensor_parallel_ranks_vocabulary_rows_equal_sglangs_own_loading(vocab_checkpoint, tp):
    """At TP 2 and 4, every rank: SGLang's own loader and the filter give the same bytes (the rank's rows, then
    zeroed padding rows); moebake read exactly the rank's rows of each tensor and never touched SGLang's views."""
    from moebake.engines.sglang.whole_model import DirectParameterLoader

    stored = load_all(vocab_checkpoint)
    padding = {"model.embed_tokens.weight": 64, "lm_head.weight": 128, "lm_head.bias": 128}
    for rank in range(tp):
        Watched.touched = []
        with sglang_oracle.sglang_engine():
            stock = vocab_holder(tp, rank)
            sglang_load(stock, sglang_weights(vocab_checkpoint))
            ours = vocab_holder(tp, rank)
            loader = DirectParameterLoader(ours, vocab_checkpoint, CPU, staged=True, chunk_bytes=1000, slots=2)
            sglang_load(ours, loader.filter(watched(sglang_weights(vocab_checkpoint))))
        read = 0
        for name, param in dict(stock.named_parameters()).items():  # the oracle is the layout it should be
            first, end, rows = rank_rows(padding[name], tp, rank)
            assert param.shape[0] == rows and (rank < tp - 1 or end - first < rows), (name, rank)  # last: padding
            assert torch.equal(param[: end - first].view(torch.uint8), stored[name][first:end].view(torch.uint8))
            assert not param[end - first :].view(torch.uint8).any(), (name, rank)
            read += stored[name][first:end].numel() * 2
        assert_parameters_equal(ours, stock, f"SGLang's own loading at TP rank {rank} of {tp}")
        stats = loader.stats
        assert stats.finished and set(stats.loaded) == set(VOCAB_NAMES) and not stats.passed
        assert stats.loaded_bytes == read
        assert stats.zeroed_bytes == sum(p.numel() * 2 for p in ours.parameters()) - read
        assert not set(VOCAB_NAMES) & set(Watched.touched)


@pytest.mark.parametrize("layout", ["added vocabulary", "presharded", "packed"])
def test_other_vocabulary_layouts_keep_sglangs_path(vocab_checkpoint, layout):
    """LoRA-added rows (``org_num_embeddings`` below ``num_embeddings``), presharded weights and a head whose method
    is not SGLang's unquantized one (AMX's ``PackWeightMethod``, which SGLang's CPU server sets) lay the rows out
    otherwise or change them after loading: those tensors are yielded unchanged, the embeddings beside them read."""
    from sglang.srt.layers.amx_utils import PackWeightMethod
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    from moebake.engines.sglang.whole_model import DirectParameterLoader

    with sglang_oracle.sglang_engine():
        tensor_parallel(2, 1)
        root = _Module()
        with torch.device(CPU):
            added = {"org_num_embeddings": VOCAB} if layout == "added vocabulary" else {}
            _place(
                root,
                "model.embed_tokens",
                VocabParallelEmbedding(VOCAB + (16 if added else 0), HIDDEN, params_dtype=torch.bfloat16, **added),
            )
            _place(
                root,
                "lm_head",
                ParallelLMHead(VOCAB, HIDDEN, bias=True, params_dtype=torch.bfloat16, use_presharded_weights=layout == "presharded"),
            )
        if layout == "packed":
            root.lm_head.quant_method = PackWeightMethod(weight_names=["weight"])
        given = dict(sglang_weights(vocab_checkpoint))
        loader = DirectParameterLoader(root, vocab_checkpoint, CPU)
        yielded = dict(loader.filter(iter(given.items())))
    kept = {"added vocabulary": {"model.embed_tokens.weight"}}.get(layout, {"lm_head.weight", "lm_head.bias"})
    assert set(yielded) == kept and all(yielded[name] is given[name] for name in yielded)
    assert set(loader.stats.loaded) == set(VOCAB_NAMES) - kept


@pytest.mark.parametrize("fails", [False, True])
def test_the_read_ahead_plans_exactly_the_loaders_ranges_reads_no_other_byte_and_changes_none(bake, monkeypatch, fails):
    """SGLang's GPT-OSS model loaded through the interception with the bake's read-ahead (:mod:`moebake.loading.
    readahead`): its plan is, range for range and in order, what the loader then reads (the other tensors first,
    then each MoE layer's rows); it reads nothing outside those ranges; the parameters equal a load with
    the read-ahead off (``MOEBAKE_READAHEAD`` unset: it is opt-in, ``=1``); an error in its reads ends it and breaks nothing; it has ended
    when SGLang's function returns."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    from moebake.engines.sglang import config as config_module
    from moebake.loading import readahead
    from moebake.loading.staged_reader import StagedReader

    intercepted = DefaultModelLoader.load_weights_and_postprocess
    reads, touched, made = [], [], []
    original_read = StagedReader.read

    def read(self, ranges):
        reads.extend((p.path, p.offset, p.dest.numel()) for p in ranges)
        return original_read(self, ranges)

    def fetch(path, offset, nbytes):
        if fails and touched:
            raise OSError("injected read error")
        touched.append((path, offset, nbytes))

    def make():
        made.append(readahead.ReadAhead(fetch=fetch))
        return made[-1]

    monkeypatch.setattr(StagedReader, "read", read)
    monkeypatch.setattr(config_module, "ReadAhead", make)
    with serving(bake):
        monkeypatch.delenv(readahead.ENV, raising=False)
        plain = _gpt_oss_model(bake, monkeypatch)
        intercepted(plain, sglang_weights(bake), CPU)
        assert not made and plain.quant_config.readahead(CPU) is None
        monkeypatch.setenv(readahead.ENV, "1")
        reads.clear()
        ours = _gpt_oss_model(bake, monkeypatch)
        intercepted(ours, sglang_weights(bake), CPU)
    assert_parameters_equal(ours, plain, "the load without the read-ahead")
    (ahead,) = made
    stats = ahead.stats
    assert ahead.stopped and not ahead.running
    planned = [(r.path, r.offset, r.nbytes) for r in ahead.planned]
    assert planned == reads and len(planned) > 5  # the same ranges, in the same order
    assert not [t for t in touched if not any(t[0] == r[0] and r[1] <= t[1] and t[1] + t[2] <= r[1] + r[2] for r in reads)]
    assert (stats.error is not None) == fails and stats.max_ahead <= readahead.WINDOW_BYTES
