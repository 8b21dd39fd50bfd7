"""`cuteforge viz`: a CuTe layout or thread-value layout drawn to SVG / PNG."""

from __future__ import annotations

import argparse


def cmd_viz(args: argparse.Namespace) -> int:
    from .. import viz

    return viz.main_viz(args.kind, args.spec, args.output, args.format, args.crop)
