"""Seam 3: a feedback saver on Inductor's algorithm selector that logs every selection
with a cuteforge candidate (logger `cuteforge.inductor`) and keeps it for `choices_log()`."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("cuteforge.inductor")

_LOG: list[dict[str, Any]] = []
_ACTIVE = [False]  # between install() and uninstall(): enable() to disable()


def _is_cuteforge(sel: str, choice: Any) -> bool:
    name = str(getattr(choice, "name", ""))
    if sel.startswith("cfi_"):
        # custom-op selections: every choice but the inductor_* decomposition (named
        # "<sel>_inductor_...") runs cuteforge: the cuteforge_<op> extern choice, and the
        # op's eager impl as the fallback ("cuteforge_inductor_<op>_fallback" on 2.13)
        return not name.startswith(f"{sel}_inductor_")
    return name.startswith("cuteforge")


def _feedback(timings: dict[Any, float], name: str, input_nodes: Any, choices: Any, *rest: Any) -> None:
    try:
        if not timings or not any(_is_cuteforge(name, c) for c in timings):
            return
        ranked = sorted(timings.items(), key=lambda kv: kv[1])
        win, win_t = ranked[0]
        cf = [(c, t) for c, t in ranked if _is_cuteforge(name, c)]
        other = [(c, t) for c, t in ranked if not _is_cuteforge(name, c)]
        try:
            shapes = [list(map(int, n.get_size())) for n in input_nodes]
        except Exception:  # noqa: BLE001
            shapes = []
        entry = {
            "op": name,
            "shapes": shapes,
            "winner": str(win.name),
            "cuteforge_won": _is_cuteforge(name, win),
            "winner_ms": float(win_t),
            "cuteforge_best": str(cf[0][0].name),
            "cuteforge_best_ms": float(cf[0][1]),
            "inductor_best": str(other[0][0].name) if other else None,
            "inductor_best_ms": float(other[0][1]) if other else None,
            "timings_ms": {str(c.name): float(t) for c, t in ranked},
        }
        _LOG.append(entry)
        log.info("cuteforge.inductor %s %s: winner %s (%.4f ms; %s); cuteforge best %s %.4f ms, inductor best %s %s ms",
                 name, shapes, entry["winner"], win_t, "cuteforge WON" if entry["cuteforge_won"] else "cuteforge lost",
                 entry["cuteforge_best"], entry["cuteforge_best_ms"], entry["inductor_best"], entry["inductor_best_ms"])
    except Exception as e:  # noqa: BLE001 - logging must never fail a compile
        log.debug("cuteforge.inductor feedback failed: %r", e)


def _selector_cache() -> Any:
    from torch._inductor import select_algorithm

    return select_algorithm.get_algorithm_selector_cache()


def ensure_feedback() -> None:
    """The selector cache can be rebuilt (cache clears); keep our saver on the live one."""
    if not _ACTIVE[0]:
        return
    fns = getattr(_selector_cache(), "feedback_saver_fns", None)
    if fns is not None and _feedback not in fns:
        fns.append(_feedback)


def install() -> None:
    """Log from now on (enable())."""
    _ACTIVE[0] = True
    ensure_feedback()


def uninstall() -> None:
    """Stop logging (disable()); the entries logged so far stay."""
    _ACTIVE[0] = False
    try:
        fns = _selector_cache().feedback_saver_fns
        while _feedback in fns:
            fns.remove(_feedback)
    except Exception:  # noqa: BLE001
        pass


def choices_log() -> list[dict[str, Any]]:
    """Every autotuning selection that had a cuteforge candidate, oldest first: op, input
    shapes, winner, whether cuteforge won, best cuteforge and best Inductor choice, all
    timings (ms)."""
    return [dict(e) for e in _LOG]


def clear_choices_log() -> None:
    _LOG.clear()
