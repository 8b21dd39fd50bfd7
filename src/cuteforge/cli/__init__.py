"""The `cuteforge` command (also `python -m cuteforge`).

Every subcommand prints for people by default and JSON with `--json`, shows progress on
stderr (a bar on a terminal, plain lines otherwise), and ends a failure with one line on
stderr and exit code 2, never a traceback. A closed pipe (`cuteforge cache ls | head -1`)
ends the command quietly.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from .bench import _print_library, cmd_bench, cmd_library
from .bundle import _print_bundle, cmd_bundle
from .common import EXIT_USAGE, CliError, Progress, _params, _set_arch, note
from .info import _print_cache, _print_info, cmd_cache, cmd_info
from .parser import build_parser
from .precompile import (
    _print_build_native,
    _print_precompile,
    build_native,
    cmd_build_native,
    cmd_precompile,
    precompile,
    precompile_specs,
)
from .show import cmd_show
from .tune import cmd_tune
from .viz import cmd_viz

__all__ = ["CliError", "Progress", "build_native", "build_parser", "main", "note", "precompile", "precompile_specs", "_params"]


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `cuteforge cache ls | head -1`: the reader is gone, end quietly
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("cuteforge: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "arch", None):
            _set_arch(args.arch)
        if args.command == "viz":
            return cmd_viz(args)
        if args.command == "tune":
            return cmd_tune(args)
        if args.command == "show":
            return cmd_show(args)
        if args.command == "bench":
            return cmd_bench(args)
        handler, printer = {
            "info": (cmd_info, _print_info),
            "cache": (cmd_cache, _print_cache),
            "precompile": (cmd_precompile, _print_precompile),
            "library": (cmd_library, _print_library),
            "bundle": (cmd_bundle, _print_bundle),
            "build-native": (cmd_build_native, _print_build_native),
        }[args.command]
        result = handler(args)
        if result is None:  # a rank other than 0 of a distributed run: rank 0 reports
            return 0
    except BrokenPipeError:
        raise
    except (CliError, ValueError, TypeError, KeyError, RuntimeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"cuteforge {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    if args.json or printer is None:
        print(json.dumps(result, indent=1, default=str))
    else:
        printer(result)
    return 0
