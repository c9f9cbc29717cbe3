"""Source format ``gpt-oss``: OpenAI GPT-OSS checkpoints in Hugging Face form (MXFP4 experts).

Detected by ``config.json``: ``model_type == "gpt_oss"`` and
``quantization_config.quant_method == "mxfp4"``. Per layer ``N`` (prefix
``model.layers.N.mlp.experts.``), with ``E`` experts, hidden ``H`` and intermediate ``I``:

  ``gate_up_proj_blocks``  U8   ``[E, 2I, H/32, 16]``  packed E2M1, low nibble = even element
  ``gate_up_proj_scales``  U8   ``[E, 2I, H/32]``      E8M0 exponents
  ``gate_up_proj_bias``    BF16 ``[E, 2I]``
  ``down_proj_blocks``     U8   ``[E, H, I/32, 16]``
  ``down_proj_scales``     U8   ``[E, H, I/32]``
  ``down_proj_bias``       BF16 ``[E, H]``

Gate/up rows are pair-interleaved (even row = gate, odd row = up), the bias likewise. The
activation is GPT-OSS SwiGLU: ``(clamp(up, -L, L) + 1) * g * sigmoid(1.702 * g)``, ``g = min(gate, L)``,
with ``L = swiglu_limit`` (a finite number > 0; 7.0 when absent, as transformers' ``GptOssConfig``).
"""

import re
from dataclasses import dataclass

from moebake.errors import CheckpointError
from moebake.formats.checkpoint import SourceCheckpoint
from moebake.formats.expert_source import ExpertSource
from moebake.formats.source_model import StoredExperts
from moebake.schema.enums import ActivationKind
from moebake.schema.manifest import Activation

FORMAT_NAME = "gpt-oss"
SWIGLU_ALPHA = 1.702  # hard-coded in GPT-OSS (not in config.json)
SWIGLU_BETA = 1.0  # the "+1" on the linear (up) half
DEFAULT_SWIGLU_LIMIT = 7.0  # transformers' GptOssConfig default when config.json has none
_EXPERT_RE = re.compile(r"^(model\.layers\.(\d+)\.mlp\.experts\.)(gate_up_proj|down_proj)_(blocks|scales|bias)$")


@dataclass(frozen=True)
class GptOssLayer:
    """One MoE layer's expert tensors (full tensor names)."""

    index: int
    prefix: str  # "model.layers.N.mlp.experts."

    def name(self, projection: str, part: str) -> str:
        return f"{self.prefix}{projection}_{part}"


@dataclass(frozen=True)
class GptOssModel(StoredExperts):
    """A validated GPT-OSS source: dimensions, layers and activation parameters."""

    checkpoint: SourceCheckpoint
    hidden_size: int
    intermediate_size: int
    num_experts: int
    swiglu_limit: float
    layers: tuple[GptOssLayer, ...]

    format_name = FORMAT_NAME
    expert_quantization = "MXFP4 experts (E2M1 + E8M0 scales per 32, BF16 biases)"
    padding_allowed = True  # SGLang zero-pads GPT-OSS's H and I (2880) for its MXFP4 kernels

    def expected_specs(self, layer: GptOssLayer) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Expected (dtype, shape) of each expert tensor of ``layer``."""
        return {s.names[0]: (s.source_dtype, (self.num_experts, *s.source_shape)) for s in self.expert_sources(layer).values()}

    def expert_sources(self, layer: GptOssLayer) -> dict[str, ExpertSource]:
        """Canonical expert tensors of ``layer`` (see :mod:`moebake.formats.expert_source`)."""
        H, I = self.hidden_size, self.intermediate_size
        w13, w2 = "gate_up_proj", "down_proj"
        return {
            "w13_weight": ExpertSource((layer.name(w13, "blocks"),), "pairs", (I, H // 2), (2 * I, H // 32, 16), "U8"),
            "w13_scale": ExpertSource((layer.name(w13, "scales"),), "pairs", (I, H // 32), (2 * I, H // 32), "U8"),
            "w13_bias": ExpertSource((layer.name(w13, "bias"),), "pairs", (I,), (2 * I,), "BF16"),
            "w2_weight": ExpertSource((layer.name(w2, "blocks"),), None, (H, I // 2), (H, I // 32, 16), "U8"),
            "w2_scale": ExpertSource((layer.name(w2, "scales"),), None, (H, I // 32), (H, I // 32), "U8"),
            "w2_bias": ExpertSource((layer.name(w2, "bias"),), None, (H,), (H,), "BF16"),
        }

    def activation(self) -> Activation:
        return Activation(kind=ActivationKind.SWIGLU_OAI, alpha=SWIGLU_ALPHA, beta=SWIGLU_BETA, limit=self.swiglu_limit)


def detect(checkpoint: SourceCheckpoint) -> bool:
    config = checkpoint.values
    quant = config.section("quantization_config")
    return config.raw("model_type") == "gpt_oss" and quant is not None and quant.raw("quant_method") == "mxfp4"


def open_model(checkpoint: SourceCheckpoint) -> GptOssModel:
    """Validate the config and every expert tensor's dtype/shape; raise MoebakeError on mismatch."""
    config = checkpoint.values
    dims = {key: config.integer(key) for key in ("hidden_size", "intermediate_size", "num_local_experts")}
    for key in ("hidden_size", "intermediate_size"):
        if dims[key] % 32:
            raise config.fail(key, f"is {dims[key]}, not a multiple of the MXFP4 block (32)")
    layer_ids = sorted({int(m.group(2)) for m in map(_EXPERT_RE.match, checkpoint.locations) if m})
    if not layer_ids:
        raise CheckpointError(f"{checkpoint.root}: gpt-oss checkpoint has no model.layers.N.mlp.experts.* tensors")
    model = GptOssModel(
        checkpoint=checkpoint,
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_experts=dims["num_local_experts"],
        swiglu_limit=config.number("swiglu_limit", DEFAULT_SWIGLU_LIMIT, positive=True),
        layers=tuple(GptOssLayer(i, f"model.layers.{i}.mlp.experts.") for i in layer_ids),
    )
    for layer in model.layers:
        for name, (dtype, shape) in model.expected_specs(layer).items():
            if name not in checkpoint.locations:
                raise CheckpointError(f"{checkpoint.root}: tensor {name} is missing")
            entry = checkpoint.entry(name)
            if entry.dtype != dtype or entry.shape != shape:
                raise CheckpointError(
                    f"{checkpoint.file_of(name).path}: tensor {name} is {entry.dtype} {list(entry.shape)}, "
                    f"expected {dtype} {list(shape)} from config.json"
                )
    return model
