"""Options of a conversion (recorded verbatim in the manifest)."""

from dataclasses import KW_ONLY, asdict, dataclass
from enum import Enum
from typing import NamedTuple

from moebake.errors import OptionError
from moebake.layouts.flashinfer_versions import LAYOUTS
from moebake.schema.enums import FlashInferLayout, GateUpGlobals
from moebake.schema.profiles import DEFAULT_ENGINE, default_flashinfer_layout, get_profile, release_for_layout

DEFAULT_CHUNK_BYTES = 64 << 20
MIN_CHUNK_BYTES = 1 << 16
MAX_CHUNK_BYTES = 1 << 34
MAX_MULTIPLE = 4096  # kernels ask for 128 or 256; larger only inflates the padding
GATE_UP_GLOBALS = tuple(mode.value for mode in GateUpGlobals)


@dataclass(frozen=True)
class ConvertOptions:
    """``engine``: the engine release (``sglang``: its newest proven; ``sglang==0.5.20``) whose load-time bytes the bake
    equals (:mod:`moebake.schema.profiles`). ``flashinfer_layout`` None: the SM90 fp4 layout its pinned FlashInfer reads.
    ``hidden_multiple`` / ``intermediate_multiple``: None = the profile's; a value overrides it
    (multiples of 128), and the manifest then says the bake is not engine-exact.
    ``chunk_bytes``: source bytes read per step; bounds peak memory.
    ``gate_up_globals``: NVFP4 experts whose gate and up global scales differ: ``share`` one global,
    rescaling the smaller half's block scales (accurate for kernels taking one W13 alpha; not the
    engine's bytes), or ``keep`` both as the source has them (the engine's bytes; SGLang's CuteDSL
    kernels then apply the gate's global to both halves, as stock SGLang does).
    The enum options accept their values as strings too (the CLI's); they are stored as the enums."""

    target: str
    _: KW_ONLY
    flashinfer_layout: FlashInferLayout | None = None
    hidden_multiple: int | None = None
    intermediate_multiple: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    engine: str = DEFAULT_ENGINE
    gate_up_globals: GateUpGlobals = GateUpGlobals.SHARE

    def __post_init__(self):
        if self.flashinfer_layout is None:  # the layout the engine release's pinned FlashInfer reads
            object.__setattr__(self, "flashinfer_layout", default_flashinfer_layout(self.engine))
        elif self.flashinfer_layout in LAYOUTS:  # a layout asked for: the engine release whose FlashInfer reads it
            object.__setattr__(self, "engine", release_for_layout(self.engine, self.target, str(FlashInferLayout(
                self.flashinfer_layout).value)))
        if self.flashinfer_layout not in LAYOUTS:
            raise OptionError(f"--flashinfer-layout {self.flashinfer_layout!r}: expected one of {', '.join(LAYOUTS)}")
        object.__setattr__(self, "flashinfer_layout", FlashInferLayout(self.flashinfer_layout))
        for name in ("hidden_multiple", "intermediate_multiple"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 < value <= MAX_MULTIPLE or value % 128):
                raise OptionError(f"--{name.replace('_', '-')} {value!r}: must be a positive multiple of 128, at most {MAX_MULTIPLE}")
        if type(self.chunk_bytes) is not int or not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise OptionError(f"chunk size {self.chunk_bytes!r} bytes: expected 64 KiB to 16 GiB")

        if self.gate_up_globals not in GATE_UP_GLOBALS:
            raise OptionError(f"--gate-up-globals {self.gate_up_globals!r}: expected one of {', '.join(GATE_UP_GLOBALS)}")
        object.__setattr__(self, "gate_up_globals", GateUpGlobals(self.gate_up_globals))
        get_profile(self.engine)

    def as_dict(self) -> dict:
        """Every option, enums as their values (as the manifest records them); ``gate_up_globals`` only where it
        is not ``share`` (manifests written before it existed mean ``share``, and read back the same)."""
        options = {key: value.value if isinstance(value, Enum) else value for key, value in asdict(self).items()}
        if options["gate_up_globals"] == GateUpGlobals.SHARE:
            del options["gate_up_globals"]
        return options

    def padding(self, source_format: str) -> "Padding":
        """The padding of ``source_format``'s experts: the engine profile's, with this conversion's overridden multiples."""
        profile = get_profile(self.engine).target(self.target, source_format)
        return Padding(self.hidden_multiple or profile.hidden_multiple, self.intermediate_multiple or profile.intermediate_multiple,
                       profile.hidden_scale_fill, profile.intermediate_scale_fill)


class Padding(NamedTuple):
    """How a bake pads H and I: to multiples of ``hidden_multiple`` / ``intermediate_multiple``; the byte
    left in the block scales' hidden padding and in their intermediate padding (E8M0: 0, or 127 = 2^0
    where the engine fills its scale buffers with it and its post-load step keeps it)."""

    hidden_multiple: int
    intermediate_multiple: int
    hidden_scale_fill: int
    intermediate_scale_fill: int


MAX_WORKERS = 2
"""The most worker processes a conversion uses, whatever ``--workers`` asks. More were never faster than one
process in the conversion benchmark (concurrent writers compete for one disk) and went over 1 GB of peak
memory, while two stay under it (docs/benchmarks.md, bench/results/convert_bench_16core.md)."""

WRITERS_PER_DEVICE = 1
"""Worker processes per storage device of the output, unless ``--writers-per-device`` raises it. A second
writer to one disk was slower than one at every size and page-cache state measured, on 2 and on 16 cores
(bench/results/convert_bench_workers_2core.md, bench/results/convert_bench_16core.md)."""
