"""`cuteforge tune`: autotune a kernel for shapes, or compile every candidate (tune_cli)."""

from __future__ import annotations

import argparse
import json
import sys

from .common import CliError, _params


def cmd_tune(args: argparse.Namespace) -> int:
    from ..tune_cli import print_tune, tune_main, tune_problems

    progress = not args.json and sys.stderr.isatty()
    if args.problems is not None:
        if args.kernel is not None or args.shapes is not None or args.param or args.dtype != "float32":
            raise CliError("--problems FILE names the kernels, shapes, dtypes and params: give no KERNEL, --shapes, "
                           "--dtype or --param with it")
        result = tune_problems(args.problems, args.workers, args.compile_only, args.arch, gpus=args.gpus,
                               force=args.force, progress=progress, verbose=not args.json, distributed=args.distributed,
                               bundle=args.bundle)
    else:
        if args.kernel is None or args.shapes is None:
            raise CliError("give KERNEL and --shapes, or --problems FILE")
        result = tune_main(
            args.kernel, args.shapes, args.dtype, args.workers, args.compile_only, args.arch,
            gpus=args.gpus, params=_params(args.param), force=args.force, progress=progress,
            verbose=not args.json, distributed=args.distributed, bundle=args.bundle,
        )
    if result is None:  # a rank other than 0 of a distributed run: rank 0 reports
        return 0
    if args.json:
        print(json.dumps({"command": "cuteforge " + " ".join(sys.argv[1:]), **result}, indent=1, default=str))
    else:
        print_tune(result)
    return 0
