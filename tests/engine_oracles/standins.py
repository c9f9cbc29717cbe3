"""Test-only stand-ins for the compiled modules SGLang imports but that cannot load on a CPU box.

SGLang's Python tree imports ``triton`` (GPU compiler, ~0.9 GB) and ``sgl_kernel`` (its CUDA
extension, 1.2 GB, pinned to another torch) at module level, though the load-time code the tests
run (``create_weights``, weight loaders, ``process_weights_after_loading``) never calls into them.
:func:`install` makes ``import triton`` / ``import sgl_kernel`` (and any of their submodules)
*made by SGLang's own modules* succeed with permissive placeholders *only when the real module is
absent*, and :func:`hide` takes them out of ``sys.modules`` again, so torch, transformers or vLLM
in the same process still find them absent: decorators such as
``triton.jit`` return the function unchanged; any other attribute is a placeholder that can be
called, subscripted, compared or inherited from, and fails loudly if it is ever used as data.

:func:`cutedsl_utils` stands in for FlashInfer's ``flashinfer.cute_dsl.utils`` where ``nvidia-cutlass-dsl``
is absent: the one function SGLang's and vLLM's CuteDSL set-up call from it, a zero-copy view.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from contextlib import contextmanager

import torch

STANDIN_ROOTS = ("triton", "sgl_kernel", "sglang_kernel", "torchvision")


NO_GPU = ("triton.runtime.driver.active",)
"""Stand-in attributes that raise, as triton's own do on a machine without a GPU (asking for the active driver):
SGLang's modules then take their CPU branch instead of reading a placeholder as a device name."""


def _attribute(owner: str, name: str):
    path = f"{owner}.{name}"
    if path in NO_GPU:
        raise RuntimeError(f"stand-in {path}: no GPU driver on this machine")
    return _Placeholder(path)


class _Placeholder:
    """What any attribute of a stand-in module is: callable (returns a placeholder, or the function
    it decorates), subscriptable, comparable, iterable as empty; usable as a base class."""

    def __init__(self, name: str = "standin"):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _Placeholder):
            return args[0]  # bare decorator: @triton.jit
        return _Placeholder(f"{self._name}()")

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _attribute(self._name, name)

    def __getitem__(self, item):
        return _Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _PermissiveClass(type):
    """Metaclass of stand-in classes: unknown class attributes are placeholders too."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{cls.__name__}.{name}")


class _StandinModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():  # a class name (triton's JITFunction, Config...): a real, empty class
            value = _PermissiveClass(name, (), {"__init__": lambda self, *args, **kwargs: None, "__module__": self.__name__})
        else:
            value = _attribute(self.__name__, name)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def __init__(self, made: types.ModuleType | None = None):
        self.made = made

    def create_module(self, spec):
        if self.made is not None:
            return self.made
        if spec.name in REAL_SUBMODULES and (real := _real_submodule(spec.name)) is not None:
            return real
        module = _StandinModule(spec.name)
        module.__path__ = []  # a package: submodules resolve through the finder too
        module.__version__ = "0.0.0+standin"
        module.__moebake_standin__ = True
        return module

    def exec_module(self, module):
        pass


REAL_SUBMODULES = {"sgl_kernel.scalar_type": "engine_oracles.sgl_scalar_type"}
"""Submodules whose values reach a kernel, served from a pure-Python twin: SGLang's Marlin MoE GEMM takes
``b_q_type.id``, which its C++ ``ScalarType::from_id`` decodes (``engine_oracles/sgl_scalar_type.py``)."""


def _real_submodule(name: str) -> types.ModuleType | None:
    """``name``'s twin of :data:`REAL_SUBMODULES` under ``name`` (its ``ScalarType`` and ``scalar_types``), or None."""
    try:
        twin = importlib.import_module(REAL_SUBMODULES[name])
    except ImportError:
        return None
    module = types.ModuleType(name)
    module.ScalarType, module.scalar_types, module.__moebake_standin__ = twin.ScalarType, twin.scalar_types, True
    return module


SERVED_TO = ("sglang", "sgl_kernel", "sglang_kernel", "triton", "torchvision", "torch")
"""Packages whose own imports get the stand-ins (torch: SGLang imports it while a stand-in is in
``sys.modules``, and torch then imports triton submodules). Everyone else (transformers, vLLM probing
``find_spec("triton")``) still sees the module as absent, so nothing outside SGLang changes course."""


def _importer() -> str:
    """``__name__`` of the module executing the ``import`` being resolved (the first frame outside importlib)."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_globals.get("__name__", "").startswith("importlib")
    ):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__", "")


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, roots):
        self.roots = roots
        self.made: dict[str, types.ModuleType] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots or _importer().split(".")[0] not in SERVED_TO:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(self.made.get(fullname)), is_package=True)


def install() -> list[str]:
    """Stand in for each of :data:`STANDIN_ROOTS` that is not installed, for imports made by SGLang's
    modules only (:data:`SERVED_TO`); returns those stood in for."""
    missing = [root for root in STANDIN_ROOTS if root not in sys.modules and importlib.util.find_spec(root) is None]
    if missing and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder(tuple(missing)))
    return missing


def hide() -> None:
    """Take the stand-ins out of ``sys.modules`` (SGLang's modules keep their references; a later import
    by SGLang gets the same module back), so that code outside SGLang finds these modules absent."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            for name in [n for n in sys.modules if n.split(".")[0] in finder.roots]:
                module = sys.modules[name]
                if getattr(module, "__moebake_standin__", False):
                    finder.made[name] = sys.modules.pop(name)


def convert_sf_to_mma_layout(sf: torch.Tensor, m: int, k: int, num_groups: int = 1, sf_vec_size: int = 16) -> torch.Tensor:
    """FlashInfer's ``flashinfer.cute_dsl.utils.convert_sf_to_mma_layout`` (0.7.2.post1), for a CPU box without
    ``nvidia-cutlass-dsl`` (its module imports ``cutlass``): the same strided view of the swizzled scale bytes,
    ``(num_groups, m_tiles, k_tiles, 32, 4, 4)`` permuted to ``(32, 4, m_tiles, 4, k_tiles, num_groups)``.
    ``test_convert_cutedsl.py`` checks this index math against FlashInfer's function where it imports."""
    m_tiles, k_tiles = -(-m // 128), -(-(-(-k // sf_vec_size)) // 4)
    return sf.view(num_groups, m_tiles, k_tiles, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)


@contextmanager
def cutedsl_utils():
    """``flashinfer.cute_dsl.utils`` as SGLang's CuteDSL post-load step and vLLM's CuteDSL kernel set-up import it: FlashInfer's own where
    ``nvidia-cutlass-dsl`` is installed, else a module holding only :func:`convert_sf_to_mma_layout`."""
    import sys
    import types

    try:
        import flashinfer.cute_dsl.utils  # noqa: F401
    except ImportError:
        module = types.ModuleType("flashinfer.cute_dsl.utils")
        module.convert_sf_to_mma_layout = convert_sf_to_mma_layout
        sys.modules[module.__name__] = module  # only this entry: SGLang's modules imported meanwhile stay imported
        try:
            yield
        finally:
            sys.modules.pop(module.__name__, None)
        return
    yield


def tolerate_config_reregistration() -> None:
    """Let an engine release register a model config that the installed transformers already has (an older SGLang
    registers its own ``qwen3_asr``, which newer transformers ship): the later registration wins, as it would against
    the transformers that release pins. Model configs decide nothing in the MoE load-time code the oracles run."""
    from transformers.models.auto import configuration_auto

    mapping = configuration_auto._LazyConfigMapping
    if getattr(mapping.register, "__moebake_tolerant__", False):
        return
    register = mapping.register

    def tolerant(self, key, value, exist_ok=False):
        return register(self, key, value, exist_ok=True)

    tolerant.__moebake_tolerant__ = True
    mapping.register = tolerant
