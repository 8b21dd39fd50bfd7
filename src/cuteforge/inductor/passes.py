"""The graph pass objects enable() installs into Inductor's config, as module-level classes.

Inductor's FX graph cache keys a compiled graph by, among other things, every custom pass in
the config: a pass must be a `CustomGraphPass` (torch/_inductor/custom_graph_pass.py) whose
`uuid()` names its behaviour, and where Inductor pickles the config (the FX graph cache's
key on some versions, subprocess compiles) the object must pickle, which a class defined
inside a function cannot. So both passes are plain classes of this module, their state is
plain data (the prior pass they chain, which rewrites they apply), and `uuid()` covers
everything their output depends on:

- `CuteforgePreGradPass` (`config.pre_grad_custom_pass`): the rewrite (`rewrites.py`), then
  the pass that was there before. uuid: cuteforge's version, the hash of this package's
  sources, the rewrites it applies, and the prior pass's uuid.
- `CuteforgeKeyPass` (`config.post_grad_custom_post_pass`): changes no graph (it runs the
  prior pass); its uuid puts "cuteforge enabled" into the key of every graph, the graphs
  without a rewrite included, since the GEMM choices of seam 1 change what Inductor
  compiles too.

A prior pass without a uuid makes the uuid None, which is what Inductor does for such a
pass on its own (runs the pre-grad pass before the cache lookup; bypasses the cache for a
post-grad one). This module imports Inductor, so enable() imports it, not `import
cuteforge.inductor`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from . import rewrites, selection_log, support
from .rewrites import REWRITES, check_rewrites

log = logging.getLogger("cuteforge.inductor")


@functools.cache
def sources_digest() -> str:
    """The sha256 of this package's sources: a graph rewritten by one version of the
    integration is never served to another."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _version() -> str:
    from .. import __version__

    return __version__


def _priors(prior: Any) -> list[Any]:
    return list(prior) if isinstance(prior, (list, tuple)) else ([prior] if prior is not None else [])


def _run_prior(prior: Any, graph: torch.fx.Graph) -> None:
    for p in _priors(prior):
        p(graph)


def _prior_uuid(prior: Any) -> tuple[Any, ...] | None:
    """The prior passes' uuids; None when one of them has none (the cache cannot know it)."""
    out = []
    for p in _priors(prior):
        u = p.uuid() if callable(getattr(p, "uuid", None)) else None
        if u is None:
            return None
        out.append(u)
    return tuple(out)


class CuteforgePreGradPass(CustomGraphPass):
    """config.pre_grad_custom_pass: the rewrite (under max-autotune), then the prior pass."""

    def __init__(self, prior: Any = None, rewrites: Iterable[str] | None = None) -> None:
        self.prior = prior
        self.rewrites = tuple(sorted(check_rewrites(rewrites)))

    def __call__(self, graph: torch.fx.Graph) -> None:
        if support.autotuning():
            counts = rewrites.rewrite_graph(graph, only=self.rewrites)
            if counts:
                selection_log.ensure_feedback()
                log.info("cuteforge.inductor: rewrote %s", counts)
        _run_prior(self.prior, graph)

    def uuid(self) -> Any:
        prior = _prior_uuid(self.prior)
        if prior is None:
            return None
        return ("cuteforge-pre", _version(), sources_digest(), self.rewrites, prior)


class CuteforgeKeyPass(CustomGraphPass):
    """config.post_grad_custom_post_pass: changes no graph (runs the prior pass); its uuid
    puts 'cuteforge enabled' into the FX graph cache key."""

    def __init__(self, prior: Any = None) -> None:
        self.prior = prior

    def __call__(self, graph: torch.fx.Graph) -> None:
        _run_prior(self.prior, graph)

    def uuid(self) -> Any:
        prior = _prior_uuid(self.prior)
        if prior is None:
            return None
        return ("cuteforge-key", _version(), sources_digest(), prior)


__all__ = ["REWRITES", "CuteforgeKeyPass", "CuteforgePreGradPass", "sources_digest"]
