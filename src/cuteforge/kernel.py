"""The authoring API: `@cuteforge.kernel` turns a builder of a `@cute.jit` function into a
callable kernel with validation, a compile key, the persistent cache and fast dispatch.

A builder receives a `CompileSpec` (dtypes, static dims, alignment, parameters, config,
target arch) and returns a `@cute.jit` host function taking the signature's tensors and
a stream. The library's own kernels are built with this same decorator.

    @cuteforge.kernel(
        signature=Signature(TensorArg("x", ("M",)), TensorArg("y", ("M",), dtype_like="x")),
        archs=("sm_80+",),
    )
    def scale(spec):
        @cute.jit
        def run(x: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream): ...
        return run

    scale(x, y, factor=2.0)   # keyword arguments are compile-time parameters
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import arch as arch_mod
from . import compiler, config_types
from .cache import DEFAULT_CACHE, STATS, KernelCache, cache_root, entry_for, source_hash
from .signature import BoundKey, Signature, check_key_part, cutlass_dtype, key_scalar, torch_dtype

REGISTRY: dict[str, Kernel] = {}


@dataclass(frozen=True)
class CompileSpec:
    """Everything a builder may specialize on. All scalars: it is the compile key."""

    kernel: str
    arch: str
    key: BoundKey
    params: tuple[tuple[str, Any], ...] = ()
    config: Any = None
    _signature: Signature | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        check_key_part(self.params, f"kernel {self.kernel!r} parameters")
        check_key_part(self.config, f"kernel {self.kernel!r} config")

    def _index(self, arg: str) -> int:
        assert self._signature is not None
        try:
            return self._signature.names.index(arg)
        except ValueError:
            raise KeyError(f"kernel {self.kernel!r} has no tensor argument {arg!r}") from None

    def dtype(self, arg: str) -> Any:
        """The cutlass numeric type of tensor argument `arg`."""
        return cutlass_dtype(self.key.dtypes[self._index(arg)])

    def bits(self, arg: str) -> int:
        """The width in bits of tensor argument `arg`'s elements, without the DSL (a cached
        kernel's lookup needs its default config, not a compile)."""
        return torch_dtype(self.key.dtypes[self._index(arg)]).itemsize * 8

    def vec(self, arg: str) -> int:
        """Elements per vector access that every row of `arg` is aligned to."""
        return self.key.vec[self._index(arg)]

    def static(self, dim: str) -> int:
        return dict(self.key.static)[dim]

    def param(self, name: str, default: Any = inspect.Parameter.empty) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        if default is inspect.Parameter.empty:
            raise KeyError(f"kernel {self.kernel!r} needs the parameter {name!r}")
        return default

    def key_repr(self) -> str:
        """The canonical text the disk cache hashes: stable across processes."""
        return repr((self.kernel, self.arch, self.key, self.params, self.config))


Builder = Callable[[CompileSpec], Any]


class Kernel:
    """A named, compiled-on-demand CuTe DSL kernel. See the module docstring."""

    def __init__(
        self,
        builder: Builder,
        *,
        name: str,
        signature: Signature,
        archs: tuple[str, ...],
        default_config: Callable[[CompileSpec], Any] | None = None,
        configs: Callable[[CompileSpec], list[Any]] | None = None,
        specializations: Callable[[], Iterable[tuple[BoundKey, dict[str, Any]]]] | None = None,
        validate: Callable[[CompileSpec, Any], None] | None = None,
        cache: KernelCache = DEFAULT_CACHE,
    ) -> None:
        self.builder = builder
        self.name = name
        self.signature = signature
        self.archs = tuple(archs)
        self.default_config = default_config
        self.specializations = specializations
        # validate_config(spec, config) raises ValueError when the config cannot run the
        # spec's problem on its target: the autotuner drops such candidates before compiling.
        self.validate_config = validate
        # configs(spec): the candidates for spec's problem, those `validate` rejects left out;
        # their classes become config types a tuning record may name (config_types.py).
        self.configs = _noted(_validated(configs, validate) if validate is not None else configs) if configs is not None else None
        self.cache = cache
        self.source_path = inspect.getsourcefile(builder)
        self._l1: dict[tuple[Any, ...], Callable[..., Any]] = {}  # compile key -> function
        self._memo: dict[tuple[Any, ...], Callable[..., Any]] = {}  # call layout -> function

    def __repr__(self) -> str:
        return f"<cuteforge.Kernel {self.name} archs={self.archs}>"

    def __call__(self, *tensors: Any, config: Any = None, **params: Any) -> Any:
        """Validate, look up (compiling at most once, ever), launch on the current stream.

        A call whose tensors have the layout of an earlier call (dtype, shape, strides,
        16-byte pointer alignment) and the same parameters skips validation and key
        derivation: those facts decide both, so the memo can only repeat their answer.
        """
        try:
            memo = (
                tuple([(t.dtype, t.shape, t.stride(), t.data_ptr() & 15) for t in tensors]),
                config,
                tuple(params.items()),
            )
            fn = self._memo[memo]
        except (AttributeError, KeyError, TypeError):
            fn = self.launcher(tensors, config=config, **params)
            if len(self._memo) >= 4096:
                self._memo.clear()
            self._memo[memo] = fn  # launcher() accepted the call, so `memo` was built
        return fn(*tensors)

    def launcher(self, tensors: tuple[Any, ...], config: Any = None, **params: Any) -> Callable[..., Any]:
        """The compiled function for these tensors' key; call it with the same tensors.

        Ops memoize this per (dtype, shape, stride) so that the warm path skips binding.
        """
        key_params = self.key_params(sorted(params.items()))
        return self.get(self.signature.bind(tensors, self.name), key_params, config)

    def key_params(self, params: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
        """Parameters as a compile-key part: numpy scalars become Python ones (equal, with the
        same hash); an unhashable or NaN value raises TypeError / ValueError naming it."""
        return tuple((k, key_scalar(v, f"kernel {self.name!r} parameter {k!r}")) for k, v in params)

    def get(self, key: BoundKey, params: tuple[tuple[str, Any], ...] = (), config: Any = None) -> Callable[..., Any]:
        l1_key = (key, params, config)
        try:
            fn = self._l1.get(l1_key)
        except TypeError:  # an unhashable parameter or config: say which
            fn = None
        if fn is not None:
            STATS.l1_hits += 1
            return fn
        params = self.key_params(params)
        l1_key = (key, params, config)
        spec = self.spec(key, params, config)
        fn = self.compile(spec)
        self._l1[l1_key] = fn
        return fn

    def spec(self, key: BoundKey, params: tuple[tuple[str, Any], ...] = (), config: Any = None, arch: str | None = None) -> CompileSpec:
        """The full compile spec; an unset config takes the kernel's heuristic default."""
        target = arch or arch_mod.target_arch()
        arch_mod.check_arch(self.name, self.archs, target)
        spec = CompileSpec(self.name, target, key, params, config, self.signature)
        if config is None and self.default_config is not None:
            spec = CompileSpec(self.name, target, key, params, self.default_config(spec), self.signature)
        config_types.note(spec.config)
        return spec

    def compile(self, spec: CompileSpec) -> Callable[..., Any]:
        """Through the cache: loaded from disk when any process compiled it before."""

        def build(keep_artifacts: bool) -> compiler.CompileResult:
            jit_fn = self.builder(spec)
            return compiler.compile_jit(jit_fn, self.signature.fake_args(spec.key), spec.arch, keep_artifacts)

        return self.cache.get(
            kernel=self.name,
            key_repr=spec.key_repr(),
            arch=spec.arch,
            compile_fn=build,
            extra_fingerprint=self.source_fingerprint(),
            source_path=self.source_path,
        )

    def source_fingerprint(self) -> str:
        """A user kernel's own source hash (library kernels are in the package hash)."""
        src = self.source_path
        return source_hash((src,)) if src and not _in_package(src) else ""

    def cache_entry(self, spec: CompileSpec) -> Path:
        """Where `spec`'s compiled object lives (or would live) in the disk cache."""
        return entry_for(
            cache_root(), kernel=self.name, key_repr=spec.key_repr(), arch=spec.arch, extra_fingerprint=self.source_fingerprint()
        ).obj


def _validated(
    configs: Callable[[CompileSpec], list[Any]], validate: Callable[[CompileSpec, Any], None]
) -> Callable[[CompileSpec], list[Any]]:
    def valid(spec: CompileSpec) -> list[Any]:
        out = []
        for c in configs(spec):
            try:
                validate(spec, c)
            except ValueError:
                continue
            out.append(c)
        return out

    return valid


def _noted(configs: Callable[[CompileSpec], list[Any]]) -> Callable[[CompileSpec], list[Any]]:
    def noted(spec: CompileSpec) -> list[Any]:
        out = configs(spec)
        for c in out:
            config_types.note(c)
        return out

    return noted


def _in_package(path: str) -> bool:
    """Library kernels are covered by the package hash; user kernels add their file's."""
    from .cache import PACKAGE_DIR

    return Path(path).resolve().is_relative_to(PACKAGE_DIR)


def kernel(
    *,
    signature: Signature,
    archs: tuple[str, ...] = ("sm_80+",),
    name: str | None = None,
    default_config: Callable[[CompileSpec], Any] | None = None,
    configs: Callable[[CompileSpec], list[Any]] | None = None,
    specializations: Callable[[], Iterable[tuple[BoundKey, dict[str, Any]]]] | None = None,
    validate: Callable[[CompileSpec, Any], None] | None = None,
) -> Callable[[Builder], Kernel]:
    """Decorator: register a builder as a cuteforge kernel. Names must be unique.

    `configs(spec)` lists candidate configs for a problem; with `validate(spec, config)`
    (raising ValueError) the kernel's `configs` keeps only the ones that pass."""

    def wrap(builder: Builder) -> Kernel:
        kname = name or builder.__name__
        if kname in REGISTRY:
            raise ValueError(f"a cuteforge kernel named {kname!r} already exists ({REGISTRY[kname].source_path})")
        k = Kernel(
            builder,
            name=kname,
            signature=signature,
            archs=archs,
            default_config=default_config,
            configs=configs,
            specializations=specializations,
            validate=validate,
        )
        REGISTRY[kname] = k
        return k

    return wrap
