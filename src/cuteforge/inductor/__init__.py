"""cuteforge kernels as autotuning candidates inside torch.compile(mode="max-autotune").

    import cuteforge.inductor
    cuteforge.inductor.enable()      # opt-in; returns False (with one warning) on an unsupported torch
    torch.compile(model, mode="max-autotune")(x)
    cuteforge.inductor.choices_log() # which cuteforge candidates won or lost, with timings
    cuteforge.inductor.disable()     # puts back exactly what enable() changed

Every coupling to Inductor internals lives in this package. Three seams, each checked on
torch 2.11 and 2.13 (both read from source):

1. mm / addmm / bmm: `InductorChoices.get_template_configs` (torch/_inductor/choices.py)
   is what `tuned_mm`, `tuned_addmm` and `tuned_bmm` (torch/_inductor/kernel/mm.py,
   bmm.py) call to turn their template lists into `ChoiceCaller`s before
   `autotune_select_algorithm`. enable() wraps that method on the class: when the list
   holds Inductor's own ATen choice ("mm", "addmm", "bmm"), one more choice is appended:
   an `ExternKernelChoice` (select_algorithm.py) whose kernel is a plain cuteforge
   function (`cuteforge_mm` ...), called directly by the timing loop and, when it wins,
   by the compiled graph (an `ir.ExternKernelAlloc`). It is timed next to cuBLAS and
   every Triton template in the same selection, so it only wins when it is faster.
2. softmax / log_softmax / rms_norm / layer_norm and Linear + relu/gelu(tanh)/silu: a
   pre-grad graph pass (`config.pre_grad_custom_pass`, run by
   torch/_inductor/fx_passes/pre_grad.py on the Dynamo graph, where these are still
   single `F.*` calls) rewrites them into single-output custom ops `cuteforge_inductor::*`
   (inference graphs only: outputs that do not require grad). Each op is registered with
   `register_custom_op_autotuning` (torch/_inductor/kernel/custom_op.py) with Inductor's
   own decomposition `inductor_*` (the plain torch expression, which Inductor compiles
   and, when it wins, inlines so its own fusion applies). Into that selection enable()
   adds one `ExternKernelChoice` whose kernel is the plain function `cuteforge_<op>` (the
   GEMM epilogue fused by cuteforge's own epilogue mechanism), by wrapping the op's
   lowering (which records its scalar arguments) and the module's
   `autotune_select_algorithm` (which appends the choice to selections named `cfi_*`).
   Inductor times both (and, on 2.13, the op's eager impl, also cuteforge) and keeps
   the fastest.
3. Logging: a feedback saver (`select_algorithm.add_feedback_saver`) sees every selection's
   timings; those with a cuteforge candidate are logged (logger `cuteforge.inductor`) and
   kept for `choices_log()`.

The FX graph cache key follows the switch: both passes are module-level, picklable
`CustomGraphPass` objects (`passes.py`) with a `uuid()` (cuteforge's version, this package's
sources, the rewrites enabled, the prior pass's uuid); the key pass goes into
`config.post_grad_custom_post_pass` (part of `FxGraphHashDetails` on both versions), so
a graph compiled with cuteforge is never served to a run without it, and the reverse.

Candidates are offered only where they can run: a CUDA device of compute capability 9.0,
static shapes, bf16/fp16 GEMM operands (fp32 too for softmax/norms), max-autotune on.
Every candidate calls the ordinary cuteforge ops, so their plan memo, on-disk compile
cache and stored tuning results serve Inductor's benchmarking and the compiled graph alike.

Modules: `support` (version gate, where candidates apply), `custom_ops` (the ops and both
sides of each selection), `gemm_choices` (seam 1), `rewrites` (seam 2's graph rewrite),
`passes` (the pass objects in Inductor's config; imported by enable()),
`selection_log` (seam 3), `switch` (enable / disable, seam 2's lowering and selection
wrappers).
"""

from .selection_log import choices_log, clear_choices_log
from .support import SUPPORTED_TORCH, unsupported_reason
from .switch import disable, enable, is_enabled

__all__ = ["enable", "disable", "is_enabled", "choices_log", "clear_choices_log", "unsupported_reason", "SUPPORTED_TORCH"]
