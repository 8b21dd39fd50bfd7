"""`cuteforge bundle create | ls | verify`: compiled kernels and tuning records to ship."""

from __future__ import annotations

import argparse
from typing import Any

from .common import CliError, _mib
from .precompile import _workers, precompile, row_lengths


def cmd_bundle(args: argparse.Namespace) -> dict[str, Any]:
    from .. import bundle
    from ..arch import target_arch

    if args.action == "create":
        if args.from_cache:
            return {"action": "create", **bundle.create_from_cache(args.path, [target_arch()], force=args.force)}
        rows = precompile(args.kernel or None, workers=_workers(args), extra_ns=row_lengths(args.shapes))
        made = bundle.create_from_cache(args.path, [target_arch()], objects=[r["entry"] for r in rows], force=args.force)
        return {"action": "create", **made, "compiled": sum(r["status"] == "compiled" for r in rows),
                "loaded": sum(r["status"] == "loaded" for r in rows)}
    if args.action == "verify":
        result = bundle.verify(args.path, args.sha256)
        if not result["ok"]:
            raise CliError(f"kernel bundle {args.path}: {len(result['bad'])} files do not match the manifest: "
                           + ", ".join(result["bad"][:5]))
        return {"action": "verify", **result}
    return {"action": "ls", **bundle.describe(args.path)}


def _print_bundle(r: dict[str, Any]) -> None:
    if r["action"] == "create":
        extra = f" ({r['compiled']} compiled, {r['loaded']} from the cache)" if "compiled" in r else ""
        print(f"wrote {r['path']}: {r['objects']} kernels, {r['tuning']} tuning records, {_mib(r['bytes'])}{extra}")
        print(f"manifest sha256 {r['sha256']}  (pin it: cuteforge.use_bundle(path, sha256=...) or CUTEFORGE_BUNDLES=path#sha256=...)")
        return
    print(f"bundle         {r['path']}")
    print(f"sha256         {r['sha256']}")
    for fid, f in r["fingerprints"].items():
        here = {True: "  (matches this installation)", False: "  (another installation: skipped here)"}.get(f.get("matches_here"), "")
        print(f"fingerprint    {fid}: {f.get('arch')}, cuteforge {f.get('cuteforge_version')}, python {f.get('python')}{here}")
    if r["action"] == "verify":
        print(f"verified       {r['objects']} kernels, {r['tuning']} tuning records: every file matches the manifest")
        return
    for o in r["objects"]:
        print(f"{o.get('kernel') or '?':28s} {o.get('arch') or '?':8s} {o.get('key') or ''}")
    print(f"{len(r['objects'])} kernels, {len(r['tuning'])} tuning records")
