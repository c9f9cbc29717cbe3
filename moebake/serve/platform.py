"""The GPU and FlashInfer a runtime runs on, and the checks that refuse what would silently be wrong.

A baked checkpoint is only right for the kernel it was baked for: the ``sm90-cutlass`` bytes are
SM90 (Hopper) CUTLASS operands, and their fp4 byte interleave is the one a FlashInfer release
family reads (``flashinfer_layout.id`` in the manifest, see
:mod:`moebake.schema.flashinfer_versions`). A mismatch raises no error in the kernel; it gives
wrong numbers. So the runtime checks both before it loads anything.

:class:`Platform` carries the facts the checks need. Fields left ``None`` are detected (the CUDA
device's compute capability, ``flashinfer.__version__``); tests and engines that know better
pass them in.
"""

import os
from dataclasses import dataclass

import torch

from moebake.errors import PlatformError
from moebake.loading.refusals import flashinfer_layout_refusal, gpu_refusal
from moebake.schema.enums import GpuFamily


@dataclass(frozen=True)
class Platform:
    """What a runtime checks a checkpoint against. ``None`` fields are detected on first use."""

    flashinfer_version: str | None = None
    capability: tuple[int, int] | None = None

    def installed_flashinfer_version(self) -> str:
        """``flashinfer.__version__`` (or the injected version); PlatformError if FlashInfer is absent."""
        if self.flashinfer_version is not None:
            return self.flashinfer_version
        try:
            import flashinfer
        except ImportError as err:
            raise PlatformError(f"FlashInfer is not importable ({err}); the sm90-cutlass runtime needs flashinfer-python") from None
        return flashinfer.__version__

    def device_capability(self, device: torch.device) -> tuple[int, int]:
        """Compute capability ``(major, minor)`` of a CUDA ``device`` (or the injected one)."""
        if self.capability is not None:
            major, minor = self.capability
            return major, minor
        if not torch.cuda.is_available():
            raise PlatformError(f"device {device}: CUDA is not available in this torch build or machine")
        return torch.cuda.get_device_capability(device)


def require_gpu(capability: tuple[int, int], device: torch.device, target: str) -> None:
    """PlatformError unless a device of compute capability ``capability`` is of a GPU family ``target`` runs on."""
    major, minor = capability
    if refusal := gpu_refusal(
        target, GpuFamily.of_capability(major), f"device {device} (compute capability {major}.{minor}, sm_{major}{minor})"
    ):
        raise PlatformError(refusal)


def require_flashinfer_layout(baked_layout: str | None, flashinfer_version: str, manifest_path: str | os.PathLike) -> None:
    """PlatformError unless FlashInfer ``flashinfer_version`` reads the SM90 fp4 layout ``baked_layout``."""
    if refusal := flashinfer_layout_refusal(baked_layout, flashinfer_version, str(manifest_path)):
        raise PlatformError(refusal)
