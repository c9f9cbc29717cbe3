"""A ``deepep-bf16`` bake served by SGLang (0.5.23, on CPU) on a set-up that cannot run it is refused by the plugin in one
line naming the flag or package to change, when SGLang builds the ``moebake`` quantization config: before any layer is
built and before any byte of the bake's shards is read (the bake's files object, which reads the shard headers, is made
last and fails the test here if it is reached).

The set-ups: another ``--moe-a2a-backend`` or ``--moe-runner-backend`` than the bake's (``deepep``, ``deep_gemm``),
DeepEP (``deep_ep``) or DeepGEMM (``deep_gemm``) that does not import, and an EP size whose ranks cannot take whole
experts. SGLang's DeepEP mode is not checked: the bake's bytes are SGLang's unquantized parameters, which its post-load
step leaves the same in every mode (normal, low_latency, auto), and SGLang runs BF16 DeepGEMM in both (contiguous and
masked).
"""

import json
from unittest import mock

import pytest

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_bf16_moe

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)

from engine_oracles.sglang_oracle import plugins_loaded_for_the_module, standins_hidden_after_each_test  # noqa: E402,F401  (autouse)

FLAGS = {"moe_runner_backend": "deep_gemm", "moe_a2a_backend": "deepep"}
EXPERTS = 4


@pytest.fixture(scope="module")
def bake(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepep-refusals")
    source = write_bf16_moe(root / "src", style="qwen3", num_layers=1, num_experts=EXPERTS, hidden=64, intermediate=32)
    out = root / "out"
    manifest = convert(source, out, ConvertOptions("deepep-bf16", engine=sglang_oracle.ENGINE), progress=False)
    assert (manifest.engine.runner_backend, manifest.engine.a2a_backend) == ("deep_gemm", "deepep")
    return out


def _importable(*absent):
    """``internals.import_problem`` as on a host where every module imports but ``absent``."""
    return lambda module: f"ModuleNotFoundError: No module named '{module}'" if module in absent else None


def quant_config(out, flags=FLAGS, absent=(), ep=1):
    """SGLang builds ``--quantization moebake``'s config for a server of ``out`` with ``flags`` (``ep`` ranks) where the
    modules ``absent`` do not import; the bake's files must not be opened."""
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    config = json.loads((out / "config.json").read_text())
    with (
        sglang_oracle.sglang_engine(gpu="sm90", **flags),
        mock.patch("moebake.engines.sglang.config.model_directory", return_value=out),
        mock.patch("moebake.engines.sglang.internals.import_problem", _importable(*absent)),
        mock.patch("moebake.engines.sglang.config.BakeFiles", side_effect=AssertionError("the bake's files were read")),
    ):
        if ep > 1:
            sglang_oracle.override_parallel(tp_size=ep, attn_tp_size=ep, moe_ep_size=ep, moe_ep_rank=0)
        return QUANTIZATION_METHODS["moebake"].from_config(config["quantization_config"])


def refusal(out, **set_up) -> str:
    from moebake.engines.sglang.refusals import MoebakeRefusal

    with pytest.raises(MoebakeRefusal) as caught:
        quant_config(out, **set_up)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("moebake: "), message
    return message


def test_the_set_up_it_is_for_reaches_the_bakes_files(bake):
    """The control: with DeepEP and DeepGEMM importable and the bake's flags, the config goes on to the files."""
    with pytest.raises(AssertionError, match="the bake's files were read"):
        quant_config(bake)


@pytest.mark.parametrize(
    "flags, flag, wanted, got",
    [
        ({"moe_runner_backend": "deep_gemm", "moe_a2a_backend": "none"}, "--moe-a2a-backend", "deepep", "none"),
        ({"moe_runner_backend": "triton", "moe_a2a_backend": "deepep"}, "--moe-runner-backend", "deep_gemm", "triton"),
        ({"moe_runner_backend": "auto", "moe_a2a_backend": "deepep"}, "--moe-runner-backend", "deep_gemm", "auto"),
    ],
    ids=["no all-to-all", "triton runner", "automatic runner"],
)
def test_another_backend_is_refused_naming_the_flag(bake, flags, flag, wanted, got):
    assert refusal(bake, flags=flags) == (
        f"moebake: this bake is for {flag} {wanted}, the server runs {flag} {got}; start it with {flag} {wanted}"
    )


@pytest.mark.parametrize(
    "module, project, flag",
    [("deep_ep", "DeepEP", "--moe-a2a-backend deepep"), ("deep_gemm", "DeepGEMM", "--moe-runner-backend deep_gemm")],
)
def test_a_backend_package_that_does_not_import_is_refused_naming_it(bake, module, project, flag):
    assert refusal(bake, absent=(module,)) == (
        f"moebake: this deepep-bf16 bake runs through {project} ({flag}), but {module} does not import here "
        f"(ModuleNotFoundError: No module named '{module}'); install {project} (the {module} package)"
    )


def test_the_package_check_imports_the_module(bake):
    """The check itself, without the stand-in: a module that imports, and one that does not."""
    from moebake.engines.sglang import internals

    assert internals.import_problem("json") is None
    problem = internals.import_problem("moebake_no_such_module")
    assert problem == "ModuleNotFoundError: No module named 'moebake_no_such_module'"


def test_an_ep_size_whose_ranks_cannot_hold_whole_experts_is_refused(bake):
    assert refusal(bake, ep=3) == (
        "moebake: layer model.layers.0.mlp.experts: 4 experts do not split evenly over 3 EP ranks; choose an --ep-size that divides 4"
    )
    with pytest.raises(AssertionError, match="the bake's files were read"):
        quant_config(bake, ep=2)  # 2 experts a rank
