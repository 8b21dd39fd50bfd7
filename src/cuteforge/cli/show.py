"""`cuteforge show`: a kernel's signature, specializations and cache entries; its device
code, or the PTX / SASS of one specialization."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import CliError, _params


def _find_kernel(name: str) -> Any:
    """A library kernel by name, or a user kernel as `module:kernel` / `path/to/file.py:kernel`."""
    from .. import kernels as families
    from ..kernel import REGISTRY, Kernel

    if ":" not in name:
        families.load_all()
        return REGISTRY.get(name)
    mod_name, _, attr = name.rpartition(":")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            spec = importlib.util.spec_from_file_location(Path(mod_name).stem, mod_name)
            if spec is None or spec.loader is None:
                raise CliError(f"cannot load {mod_name!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(mod_name)
    except (ImportError, FileNotFoundError) as e:
        raise CliError(f"cannot import {mod_name!r}: {e}") from None
    k = getattr(module, attr, None)
    if not isinstance(k, Kernel):
        raise CliError(f"{mod_name}:{attr} is not a @cuteforge.kernel (got {type(k).__name__})")
    return k


def _device_files(fn: Any, home: str, seen: set[int] | None = None, out: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Source files of the device code a builder reaches: the functions in its closures and
    the module-level functions it names, kept where they live in cuteforge's kernels or in
    the builder's own module (`home`)."""
    seen = set() if seen is None else seen
    out = {} if out is None else out
    if id(fn) in seen or not isinstance(fn, types.FunctionType):
        return out
    seen.add(id(fn))
    code = fn.__code__
    if hasattr(fn, "_decorator_kind") or code.co_filename != inspect.getsourcefile(fn):
        out.setdefault(code.co_filename, set()).add(fn.__qualname__)
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):
            _device_files(cell.cell_contents, home, seen, out)

    def names(co: types.CodeType) -> Iterator[str]:
        yield from co.co_names
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                yield from names(c)

    for n in names(code):
        v = fn.__globals__.get(n)
        if isinstance(v, types.FunctionType) and (v.__module__ or "").startswith(("cuteforge.kernels", home)):
            out.setdefault(v.__code__.co_filename, set()).add(v.__qualname__)
            _device_files(v, home, seen, out)
    return out


def _specializations(k: Any, args: argparse.Namespace) -> list[tuple[Any, dict[str, Any]]]:
    """The specializations `show` can compile: --tensors (with --param) make one; otherwise
    the kernel's standard ones."""
    if args.tensors:
        import torch

        from ..signature import torch_dtype

        tensors = []
        for item in args.tensors.split(";"):
            dt, _, shape = item.strip().partition("[")
            try:
                dims = [int(d) for d in shape.rstrip("]").split(",") if d.strip()]
                tensors.append(torch.empty(dims, dtype=torch_dtype(dt.strip()), device="meta"))
            except (ValueError, KeyError, TypeError):
                raise CliError(f"--tensors: {item!r} is not DTYPE[D0,D1,...], e.g. float32[4096,1024]") from None
        return [(k.signature.fresh_key(tensors), _params(args.param))]
    specs = [(key, {**params, **_params(args.param)}) for key, params in (k.specializations() if k.specializations else [])]
    return specs


def cmd_show(args: argparse.Namespace) -> int:
    """A kernel's signature, specializations and cache entries; its device code; the PTX or
    SASS of one specialization (--spec picks it, --tensors describes a new one)."""
    from .. import compiler
    from ..cache import list_entries
    from ..kernel import REGISTRY

    k = _find_kernel(args.kernel)
    if k is None:
        from ..templates.show import show_generated  # template kernels: their generated sources

        if show_generated(args.kernel, source=args.source, ptx=args.ptx, sass=args.sass):
            return 0
        raise CliError(f"unknown kernel {args.kernel!r}; known: {', '.join(sorted(REGISTRY))} "
                       "(a kernel of your own: module:kernel or path/to/file.py:kernel)")
    specs = _specializations(k, args)
    if args.source:
        files: dict[str, set[str]] = {}
        if specs:
            key, params = specs[min(args.spec, len(specs) - 1)]
            _device_files(k.builder(k.spec(key, k.key_params(sorted(params.items())))), k.builder.__module__, out=files)
        else:
            _device_files(k.builder, k.builder.__module__, out=files)
        dsl_dir = os.path.dirname(os.path.dirname(importlib.util.find_spec("cutlass").origin or ""))
        shown = [f for f in files if not f.startswith(dsl_dir) and os.path.exists(f)] or [k.source_path]
        for f in shown:
            print(f"# ===== {f} ({', '.join(sorted(files.get(f, ()))) or 'builder'})")
            print(Path(f).read_text())
        return 0
    if args.ptx or args.sass:
        if not specs:
            raise CliError(f"kernel {k.name!r} declares no standard specializations: describe one with "
                           "--tensors 'float32[4096,1024];...' (and --param NAME=VALUE)")
        if not 0 <= args.spec < len(specs):
            raise CliError(f"--spec {args.spec}: kernel {k.name!r} has specializations 0..{len(specs) - 1} (see `cuteforge show {args.kernel}`)")
        key, params = specs[args.spec]
        spec = k.spec(key, k.key_params(sorted(params.items())))
        compiler.prepare_dsl(spec.arch)
        result = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), spec.arch, keep_artifacts=True)
        print(f"# {k.name} {spec.key_repr()}")
        print((result.ptx or "") if args.ptx else compiler.sass(result.cubin or b""))
        return 0
    info: dict[str, Any] = {
        "kernel": k.name,
        "archs": list(k.archs),
        "source": k.source_path,
        "signature": [
            {"name": a.name, "dims": list(a.dims), "dtypes": [str(d).removeprefix("torch.") for d in a.dtypes], "leading": a.leading}
            for a in k.signature.args
        ],
        "static": list(k.signature.static),
        "specializations": [],
        "cached_entries": sum(e["kernel"] == k.name for e in list_entries()),
    }
    for i, (key, params) in enumerate(specs):
        spec = k.spec(key, k.key_params(sorted(params.items())))
        info["specializations"].append({"index": i, "key": spec.key_repr(), "config": repr(spec.config)})
        if i == 0:
            info["candidates"] = [repr(c) for c in (k.configs(spec) if k.configs else [])]
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"kernel         {info['kernel']}  (archs {', '.join(info['archs'])})")
    print(f"source         {info['source']}")
    for a in info["signature"]:
        print(f"  {a['name']:12s} dims ({', '.join(a['dims'])})  dtypes {', '.join(a['dtypes'])}")
    print(f"static dims    {', '.join(info['static']) or '-'}")
    print(f"cache entries  {info['cached_entries']}")
    print(f"specializations ({len(specs)}; --spec N picks one for --ptx / --sass):")
    for sp in info["specializations"]:
        print(f"  [{sp['index']}] {sp['key']}")
    if info.get("candidates"):
        print(f"configs tried for [0] ({len(info['candidates'])}):")
        for c in info["candidates"]:
            print(f"  {c}")
    return 0
