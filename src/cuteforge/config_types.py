"""The config classes a stored tuning record may name, and configs to and from JSON.

A record names its config's class; reading it back looks that name up here and nowhere
else: no name read from a file is ever imported or called. A class is registered when
code hands cuteforge one of its instances (a kernel's default or candidate configs,
`Kernel.spec`, a tuning result being saved) or explicitly with `register`. A record's
fields are JSON scalars (lists become tuples), of the types the class's defaults have.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")
_TYPES: dict[str, type] = {}


def type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_frozen_dataclass(cls: Any) -> bool:
    params = getattr(cls, "__dataclass_params__", None)
    return isinstance(cls, type) and params is not None and params.frozen


def register(cls: type[T]) -> type[T]:
    """Allow tuning records to name `cls` (a frozen dataclass); usable as a decorator."""
    if not _is_frozen_dataclass(cls):
        raise TypeError(f"a config type must be a frozen dataclass, got {cls!r}")
    _TYPES[type_name(cls)] = cls
    return cls


def note(config: Any) -> None:
    """Register the class of a config that code handed over (None and non-dataclasses: nothing)."""
    cls = type(config)
    if _is_frozen_dataclass(cls) and type_name(cls) not in _TYPES:
        _TYPES[type_name(cls)] = cls


def known(name: str) -> type | None:
    return _TYPES.get(name)


def to_json(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        note(config)
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        return {"type": type_name(type(config)), "fields": fields}
    return {"type": None, "repr": repr(config)}


def _plain(value: Any) -> Any:
    """A JSON value as a key part: lists become tuples; NaN, dicts and the rest are refused."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"non-finite value {value!r}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    raise ValueError(f"a {type(value).__name__} is not a config field value")


def _fits(value: Any, default: Any) -> bool:
    """Whether `value` has the type of a field whose default is `default`."""
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def from_json(d: Any) -> Any:
    """The config a `to_json` dict describes; raises ValueError saying why it cannot be
    rebuilt (an unregistered type, unknown or ill-typed fields)."""
    if not isinstance(d, Mapping) or not isinstance(d.get("type"), str) or not isinstance(d.get("fields"), Mapping):
        raise ValueError("not a stored config")
    cls = _TYPES.get(d["type"])
    if cls is None:
        raise ValueError(f"config type {d['type']!r} is not a registered config class")
    declared = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for name, raw in d["fields"].items():
        f = declared.get(name)
        if f is None:
            raise ValueError(f"{type_name(cls)} has no field {name!r}")
        value = _plain(raw)
        default = f.default if f.default is not dataclasses.MISSING else None
        if not _fits(value, default):
            raise ValueError(f"{type_name(cls)}.{name} = {value!r} does not have the type of its default {default!r}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{type_name(cls)}({kwargs}) cannot be built: {e}") from None
