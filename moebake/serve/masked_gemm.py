"""Masked grouped GEMM over the DeepEP low-latency layout: ``d[g, :m_g] = a[g, :m_g] @ b[g].T``.

Operands follow DeepGEMM's "NT" convention:

  ``a``         BF16  ``[G, M, K]``  activations, row-major (DeepEP's ``[E_local, T_max, H]``)
  ``b``         BF16  ``[G, N, K]``  weights as checkpoints store them, ``[out, in]``
  ``masked_m``  int32 ``[G]``        on a's device: rows ``[0, masked_m[g])`` of group ``g`` are valid
  ``expected_m`` int > 0             a hint of the typical ``masked_m`` (DeepGEMM picks its tiles by it)
  returns ``d`` BF16 ``[G, M, N]``; its rows at or past ``masked_m[g]`` are unspecified (callers mask).

Two backends with that contract (:class:`MaskedGemm`):

* ``deep_gemm``: ``deep_gemm.m_grouped_bf16_gemm_nt_masked`` from sgl-deep-gemm (SM90 / SM100;
  JIT-compiled per ``(G, N, K)`` on first use). It needs ``M % 128 == 0`` (output tiles of 128 rows
  are stored whole, so a partial tile would spill into the next group) and ``K % 64 == 0`` (SM90
  BF16 kernel assert), recorded as ``m_align`` / ``k_align``. It skips the tiles past masked_m.
* ``torch``: ``torch.bmm`` over all ``M`` rows (fp32 accumulation, BF16 result); any device, any shape.
  The rows past masked_m are zeroed first: torch's CPU BF16 GEMM lets a NaN in one row of ``a``
  reach other rows of ``d`` (seen with torch 2.13 from about K = 1000, M = 96), and DeepEP leaves
  those rows uninitialised.

:func:`default_backend` picks DeepGEMM when it imports and the device is a CUDA SM90/SM100 GPU,
the torch fallback otherwise; :func:`deep_gemm_status` says why DeepGEMM was not usable.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from moebake.errors import InvalidArgumentError, PlatformError

DEEP_GEMM_ARCHS = (9, 10)  # compute capability majors with DeepGEMM masked kernels (SM90, SM100)


@dataclass(frozen=True)
class MaskedGemm:
    """A masked grouped GEMM backend: ``run(a, b, masked_m, expected_m) -> d`` and the shapes it needs.

    ``m_align`` / ``k_align``: ``M`` and ``K`` must be multiples of these (callers zero-pad).
    """

    name: str
    m_align: int
    k_align: int
    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@functools.cache
def deep_gemm_status() -> tuple[ModuleType | None, str]:
    """``(deep_gemm, "")`` when DeepGEMM's BF16 masked GEMM is importable, else ``(None, why)``."""
    try:
        # torch is imported first (it is, above): its CUDA library preload resolves deep_gemm's sonames.
        import deep_gemm
    except Exception as err:  # noqa: BLE001 - ImportError, OSError (a missing .so), RuntimeError (ABI): all mean "absent"
        return None, f"import deep_gemm failed: {type(err).__name__}: {err}"
    if not hasattr(deep_gemm, "m_grouped_bf16_gemm_nt_masked"):
        version = getattr(deep_gemm, "__version__", "?")
        return None, f"deep_gemm {version} has no m_grouped_bf16_gemm_nt_masked"
    return deep_gemm, ""


def valid_rows(masked_m: torch.Tensor, t_max: int) -> torch.Tensor:
    """Bool ``[G, t_max, 1]``: row ``t`` of group ``g`` is valid (``t < masked_m[g]``); no host sync."""
    return (torch.arange(t_max, device=masked_m.device)[None, :] < masked_m[:, None])[..., None]


def _torch_run(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    return torch.bmm(a.masked_fill(~valid_rows(masked_m, a.shape[1]), 0), b.transpose(1, 2))


def _deep_gemm_run(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    deep_gemm, why = deep_gemm_status()
    if deep_gemm is None:
        raise PlatformError(why)
    d = torch.empty(a.shape[0], a.shape[1], b.shape[1], dtype=torch.bfloat16, device=a.device)
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)
    return d


TORCH = MaskedGemm("torch", m_align=1, k_align=1, run=_torch_run)
DEEP_GEMM = MaskedGemm("deep_gemm", m_align=128, k_align=64, run=_deep_gemm_run)
BACKENDS = {backend.name: backend for backend in (DEEP_GEMM, TORCH)}


def default_backend(device: torch.device | str) -> MaskedGemm:
    """DeepGEMM on a CUDA SM90/SM100 device when it imports, else the torch fallback."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] not in DEEP_GEMM_ARCHS:
        return TORCH
    return DEEP_GEMM if deep_gemm_status()[0] is not None else TORCH


def get_backend(backend: MaskedGemm | str | None, device: torch.device | str) -> MaskedGemm:
    """``backend`` by name (``deep_gemm``, ``torch``) or as given; None: :func:`default_backend`."""
    if backend is None:
        return default_backend(device)
    if isinstance(backend, MaskedGemm):
        return backend
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"unknown masked GEMM backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return BACKENDS[backend]
