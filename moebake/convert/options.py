"""Options of a conversion (recorded verbatim in the manifest)."""

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from moebake.errors import OptionError, UnsupportedError
from moebake.schema.engine_release import EngineRelease
from moebake.schema.enums import FlashInferLayout, GateUpGlobals
from moebake.schema.flashinfer_versions import LAYOUTS
from moebake.schema.profiles import (
    DEFAULT_ENGINE,
    Padding,
    ReleaseProfile,
    parse_engine,
    pinned_layout,
    release_for_layout,
    release_profile,
)
from moebake.schema.targets import target_spec

DEFAULT_CHUNK_BYTES = 64 << 20
MIN_CHUNK_BYTES = 1 << 16
MAX_CHUNK_BYTES = 1 << 34
MAX_MULTIPLE = 4096  # kernels ask for 128 or 256; larger only inflates the padding
GATE_UP_GLOBALS = tuple(mode.value for mode in GateUpGlobals)


@dataclass(frozen=True)
class ConvertOptions:
    """``engine``: the engine release whose load-time bytes the bake equals (:mod:`moebake.schema.profiles`): an engine
    name (``sglang``: its newest proven release) or an :class:`EngineRelease` (``sglang==0.5.20`` as text is parsed
    here, the library's entry point); :attr:`release` is the release it names and :attr:`profile` that release's
    profile, resolved once here. ``flashinfer_layout`` None: the SM90 fp4 layout the release's pinned FlashInfer reads;
    for a target without that layout it is None whatever was given (it changes no byte there).
    ``hidden_multiple`` / ``intermediate_multiple``: None = the profile's; a value overrides it
    (multiples of 128), and the manifest then says the bake is not engine-exact where it pads to other sizes.
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
    engine: str | EngineRelease = DEFAULT_ENGINE
    gate_up_globals: GateUpGlobals = GateUpGlobals.SHARE
    release: EngineRelease = field(init=False, repr=False)
    profile: ReleaseProfile = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        engine: str | EngineRelease = self.engine
        if isinstance(engine, str) and "==" in engine:
            engine = parse_engine(engine)
        release = engine if isinstance(engine, EngineRelease) else parse_engine(engine)
        if self.flashinfer_layout is not None and self.flashinfer_layout not in LAYOUTS:
            raise OptionError(f"--flashinfer-layout {self.flashinfer_layout!r}: expected one of {', '.join(LAYOUTS)}")
        layout: str | None = self.flashinfer_layout
        if layout is None:  # the layout the engine release's pinned FlashInfer reads
            layout = pinned_layout(release) or FlashInferLayout.V2.value
        else:  # a layout asked for: the engine release whose FlashInfer reads it
            layout = FlashInferLayout(layout).value
            chosen = release_for_layout(release, isinstance(engine, EngineRelease), self.target, layout)
            if chosen != release:
                engine = release = chosen
        object.__setattr__(self, "engine", engine)
        object.__setattr__(self, "release", release)
        object.__setattr__(self, "flashinfer_layout", FlashInferLayout(layout) if self._uses_layout() else None)
        for name in ("hidden_multiple", "intermediate_multiple"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 < value <= MAX_MULTIPLE or value % 128):
                raise OptionError(f"--{name.replace('_', '-')} {value!r}: must be a positive multiple of 128, at most {MAX_MULTIPLE}")
        if type(self.chunk_bytes) is not int or not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise OptionError(f"chunk size {self.chunk_bytes!r} bytes: expected 64 KiB to 16 GiB")

        if self.gate_up_globals not in GATE_UP_GLOBALS:
            raise OptionError(f"--gate-up-globals {self.gate_up_globals!r}: expected one of {', '.join(GATE_UP_GLOBALS)}")
        object.__setattr__(self, "gate_up_globals", GateUpGlobals(self.gate_up_globals))
        object.__setattr__(self, "profile", release_profile(release))

    def _uses_layout(self) -> bool:
        """Whether the target bakes FlashInfer's SM90 fp4 layout (an unknown target: as if it did, refused later)."""
        try:
            return target_spec(self.target).uses_flashinfer_layout
        except UnsupportedError:
            return True

    @property
    def engine_text(self) -> str:
        """The ``engine`` option as recorded: the engine's name, or ``sglang==0.5.20`` for a named release."""
        return self.engine.spec if isinstance(self.engine, EngineRelease) else self.engine

    def as_dict(self) -> dict[str, Any]:
        """Every option, enums as their values (as the manifest records them); ``flashinfer_layout`` only for a target
        that bakes that layout, ``gate_up_globals`` only where it is not ``share`` (manifests written before it
        existed mean ``share``, and read back the same)."""
        options: dict[str, Any] = {"target": self.target}
        if self.flashinfer_layout is not None:
            options["flashinfer_layout"] = self.flashinfer_layout.value
        options |= {
            "hidden_multiple": self.hidden_multiple,
            "intermediate_multiple": self.intermediate_multiple,
            "chunk_bytes": self.chunk_bytes,
            "engine": self.engine_text,
        }
        if self.gate_up_globals != GateUpGlobals.SHARE:
            options["gate_up_globals"] = self.gate_up_globals.value
        return options

    def padding(self, source_format: str) -> Padding:
        """The padding of ``source_format``'s experts: the release profile's, with this conversion's overridden multiples."""
        entry = self.profile.target(self.target, source_format)
        return Padding(
            self.hidden_multiple or entry.hidden_multiple,
            self.intermediate_multiple or entry.intermediate_multiple,
            entry.hidden_scale_fill,
            entry.intermediate_scale_fill,
        )


MAX_WORKERS = 2
"""The most worker processes a conversion uses, whatever ``--workers`` asks. More were never faster than one
process in the conversion benchmark (concurrent writers compete for one disk) and went over 1 GB of peak
memory, while two stay under it (docs/benchmarks.md, bench/results/convert_bench_16core.md)."""

WRITERS_PER_DEVICE = 1
"""Worker processes per storage device of the output, unless ``--writers-per-device`` raises it. A second
writer to one disk was slower than one at every size and page-cache state measured, on 2 and on 16 cores
(bench/results/convert_bench_16core.md)."""
