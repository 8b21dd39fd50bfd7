"""`cuteforge show` for template kernels: generated sources, and their PTX/SASS.

A generated kernel is found by its name (`cuteforge_<template>_<hash8>`) or by its
template's name in the source cache; each rendered file has a `.json` beside it naming
its variant module, compile key and parameters, which is enough to compile it again
(for --ptx / --sass) in a fresh process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import codecache


def find(name: str) -> list[tuple[Path, dict[str, Any]]]:
    """Rendered sources whose kernel name or template name is `name`, newest first."""
    out = []
    for p in codecache.list_sources():
        meta_path = p.with_suffix(".json")
        if p.name.startswith("v") or not meta_path.exists():
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if name in (meta.get("kernel_name"), meta.get("template"), meta.get("variant")):
            out.append((p, meta))
    return out


def compile_artifacts(meta: dict[str, Any]) -> Any:
    """Compile one rendered kernel again with PTX/CUBIN kept (no cache write)."""
    import sys

    from .. import compiler
    from ..kernel import REGISTRY
    from ..signature import BoundKey
    from .variant import TemplateConfig

    if meta["variant_module"] not in sys.modules:
        _load_variant(meta["variant_module"])
    k = REGISTRY[meta["variant"]]
    key = BoundKey(tuple(meta["key"]["dtypes"]), tuple(tuple(s) for s in meta["key"]["static"]), tuple(meta["key"]["vec"]))
    spec = k.spec(key, (), TemplateConfig(tuple(tuple(p) for p in meta["config"])))
    r = k.render(spec)  # type: ignore[attr-defined]
    return compiler.compile_jit(k.entry_point(r), k.signature.fake_args(key), spec.arch, keep_artifacts=True)  # type: ignore[attr-defined]


def _load_variant(module: str) -> None:
    prefix = f"{codecache.PACKAGE}.v"
    codecache.load(module.removeprefix(prefix), prefix="v")


def show_generated(name: str, *, source: bool = False, ptx: bool = False, sass: bool = False) -> bool:
    """Print what `cuteforge show NAME` shows for a template kernel; False if unknown."""
    found = find(name)
    if not found:
        return False
    if source:
        for p, _ in found if found[0][1]["kernel_name"] != name else found[:1]:
            print(f"# {p}")
            print(p.read_text())
        return True
    if ptx or sass:
        p, meta = found[0]
        result = compile_artifacts(meta)
        print(f"# {meta['kernel_name']} ({p})")
        from .. import compiler

        print((result.ptx or "") if ptx else compiler.sass(result.cubin or b""))
        return True
    rows = [{"kernel": m["kernel_name"], "template": m["template"], "variant": m["variant"], "params": dict(m["config"]),
             "dtypes": m["key"]["dtypes"], "source": str(p)} for p, m in found]
    print(json.dumps(rows if len(rows) > 1 or rows[0]["kernel"] != name else rows[0], indent=1))
    return True
