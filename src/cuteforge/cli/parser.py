"""The argument parser of the `cuteforge` command: every subcommand and its flags."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(prog="cuteforge", description="Compile-once CuTe DSL kernels for PyTorch.")
    p.add_argument("--version", action="version", version=f"cuteforge {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="GPU, DSL version, cache dir, target arch")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("cache", help="inspect or clear the persistent kernel cache")
    s.add_argument("action", choices=("stats", "ls", "clear"))
    s.add_argument("--yes", "-y", action="store_true", help="clear: do not ask")
    s.add_argument("--json", action="store_true")

    for name, help_ in (
        ("precompile", "compile every library kernel's standard specializations (no GPU needed)"),
        ("library", "main job: benchmark the library against torch (GPU) or precompile it (no GPU)"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--arch", help="target, e.g. sm_90a (default: this GPU's, else sm_90a)")
        s.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
        s.add_argument("--json", action="store_true")
        s.add_argument("--workers", type=int, metavar="N", help="compile processes (default: 1 for precompile, "
                       "the CPU count for library; CUTEFORGE_COMPILE_WORKERS)")
        if name == "library":
            s.add_argument("--quick", action="store_true", help="fewer shapes")
        else:
            s.add_argument("--distributed", action="store_true", help="under torchrun: split the specializations "
                           "over the ranks, gather the objects to rank 0, which writes the --bundle")
            s.add_argument("--bundle", metavar="OUT", help="with --distributed: the bundle directory rank 0 writes")
            s.add_argument("--force", action="store_true", help="with --distributed: replace an existing bundle")
            s.add_argument("--shapes", metavar="N,...", help="more row lengths for the row kernels (norms, softmax, "
                           "cross-entropy, reductions) besides the standard grid: N or MxN (only N keys them), "
                           "e.g. 7168,4096x14336")

    s = sub.add_parser("build-native", help="build the C++ extension now (calls otherwise build it in the background)")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("bundle", help="kernel bundles: compiled kernels and tuning records to ship to other machines")
    s.add_argument("action", choices=("create", "ls", "verify"))
    s.add_argument("path", help="the bundle directory (create: where to write it)")
    s.add_argument("--from-cache", action="store_true", help="create: pack what the kernel cache holds for the target "
                   "instead of precompiling the library's standard specializations")
    s.add_argument("--arch", help="create: target, e.g. sm_90a (default: this GPU's, else sm_90a)")
    s.add_argument("--kernel", action="append", help="create: only this kernel (repeatable)")
    s.add_argument("--workers", type=int, metavar="N", help="create: compile processes (default: the CPU count)")
    s.add_argument("--force", action="store_true", help="create: replace an existing bundle")
    s.add_argument("--shapes", metavar="N,...", help="create: more row lengths for the row kernels besides the "
                   "standard grid (as precompile --shapes)")
    s.add_argument("--sha256", metavar="HEX", help="verify: the manifest must hash to this")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("bench", help="benchmark ops against torch (GPU), or report on recorded results (--from)")
    s.add_argument("ops", nargs="*", help="ops to measure (default: sum): sum, mean, amax, amin, argmax, softmax, log_softmax, rms_norm, layer_norm, cross_entropy")
    s.add_argument("--shapes", help="comma-separated MxN (default: the standard set)")
    s.add_argument("--dtype", default="float32,bfloat16", help="comma-separated dtypes")
    s.add_argument("--quick", action="store_true", help="fewer shapes, no torch.compile")
    s.add_argument("--from", dest="from_", action="append", metavar="RESULTS.json",
                   help="report on recorded results instead of measuring (repeatable; no GPU needed)")
    s.add_argument("--json", metavar="FILE", help="write the measured results to FILE ('-': stdout)")
    s.add_argument("--plot", metavar="DIR", help="write one PNG per op family into DIR")
    s.add_argument("--report", metavar="FILE.html", help="write one self-contained HTML page with all plots and tables")

    s = sub.add_parser("show", help="a kernel's signature, specializations and cache entries; its device code, PTX or SASS")
    s.add_argument("kernel", help="a library kernel, or your own as module:kernel or path/to/file.py:kernel")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--source", action="store_true", help="print the kernel's device code")
    g.add_argument("--ptx", action="store_true", help="compile one specialization, print its PTX")
    g.add_argument("--sass", action="store_true", help="same, SASS (needs nvdisasm or cuobjdump)")
    s.add_argument("--spec", type=int, default=0, metavar="N", help="which specialization (listed by `show K`; default 0)")
    s.add_argument("--tensors", metavar="'DTYPE[D,...];...'", help="describe a specialization by its tensors, e.g. 'float32[1000];float32[1000]'")
    s.add_argument("--param", action="append", metavar="NAME=VALUE", help="a kernel parameter (repeatable)")
    s.add_argument("--arch", help="target, e.g. sm_90a")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("tune", help="autotune a kernel for shapes (or compile every candidate, no GPU)")
    s.add_argument("kernel", nargs="?", help="row_reduce, softmax_fwd, softmax_bwd, norm_fwd, cross_entropy_fwd, "
                   "cross_entropy_bwd, gemm_sm90_{tn,nt,nn,tt}[_col]")
    s.add_argument("--shapes", help="comma-separated MxN (GEMMs: MxNxK), e.g. 32768x4096,4096x65536")
    s.add_argument("--problems", metavar="FILE", help="instead of KERNEL --shapes: a JSON list of "
                   '{"kernel", "shapes", "dtype", "params"} entries, tuned in one command (with --distributed: '
                   "every problem dealt to the ranks at once)")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--workers", type=int, help="compile processes (default: CPU count)")
    s.add_argument("--compile-only", action="store_true", help="compile every valid candidate; no GPU needed")
    s.add_argument("--arch", help="target, e.g. sm_90a")
    s.add_argument("--gpus", help="'all' or N: one timing process per GPU")
    s.add_argument("--force", action="store_true", help="re-tune even if a stored result exists")
    s.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="a problem parameter (repeatable), e.g. op=amax (row_reduce), mode=log_softmax "
                   "(softmax_*), kind=layer (norm_fwd), ignore_index=-1 (cross_entropy_*), act=gelu (gemm_sm90_*)")
    s.add_argument("--distributed", action="store_true", help="under torchrun (one GPU a rank, cuda:LOCAL_RANK): "
                   "the ranks split the shapes and gather the tuning records to rank 0, which writes them into its "
                   "tuning store (or --bundle); works across hosts (torch.distributed, gloo)")
    s.add_argument("--bundle", metavar="OUT", help="with --distributed: rank 0 writes the records, with each "
                   "problem's winning compiled object, into a new kernel bundle at OUT")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("viz", help="render a CuTe layout or thread-value layout to SVG/PNG")
    s.add_argument("kind", choices=("layout", "tv", "mma"))
    s.add_argument("spec", nargs="+", help='layout text, e.g. "(4,8):(8,1)"; for tv: THR VAL; '
                   "for mma: PRESET [A|B|C] [MxNxK atoms], e.g. sm80_16x8x16 C 2x2x1")
    s.add_argument("-o", "--output", help="write .svg or .png here (default: SVG on stdout)")
    s.add_argument("--format", choices=("auto", "svg", "png"), default="auto")
    s.add_argument("--crop", metavar="M0:M1,N0:N1", help="draw only these rows and columns (zoom into a large layout)")
    return p
