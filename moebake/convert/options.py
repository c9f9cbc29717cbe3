"""Options of a conversion (recorded verbatim in the manifest)."""

from dataclasses import asdict, dataclass

from moebake.errors import OptionError
from moebake.layouts.flashinfer_versions import LAYOUTS

DEFAULT_CHUNK_BYTES = 64 << 20
MIN_CHUNK_BYTES = 1 << 16
MAX_CHUNK_BYTES = 1 << 34
MAX_MULTIPLE = 4096  # kernels ask for 128 or 256; larger only inflates the padding


@dataclass(frozen=True)
class ConvertOptions:
    """``hidden_multiple`` / ``intermediate_multiple``: H and I are zero-padded up to multiples of these
    (multiples of 128; SGLang 0.5.23 pads GPT-OSS's hidden to a multiple of 256).
    ``chunk_bytes``: source bytes read per step; bounds peak memory."""

    target: str
    flashinfer_layout: str = "v2"
    hidden_multiple: int = 128
    intermediate_multiple: int = 128
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self):
        if self.flashinfer_layout not in LAYOUTS:
            raise OptionError(f"--flashinfer-layout {self.flashinfer_layout!r}: expected one of {', '.join(LAYOUTS)}")
        for name in ("hidden_multiple", "intermediate_multiple"):
            value = getattr(self, name)
            if type(value) is not int or not 0 < value <= MAX_MULTIPLE or value % 128:
                raise OptionError(f"--{name.replace('_', '-')} {value!r}: must be a positive multiple of 128, at most {MAX_MULTIPLE}")
        if type(self.chunk_bytes) is not int or not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise OptionError(f"chunk size {self.chunk_bytes!r} bytes: expected 64 KiB to 16 GiB")

    def as_dict(self) -> dict:
        return asdict(self)
