"""Typed reads of GGUF metadata for the model descriptions: each value checked for type and range, an error naming
the key, the expected and the found value."""

from __future__ import annotations

import math

import numpy as np

from ..gguf import GGUFFile
from .config import MAX_CTX, ModelError

REQUIRED = object()


def show(v: object) -> str:
    text = repr(v.to_list()[:4] if hasattr(v, "to_list") else v)
    return text if len(text) <= 60 else text[:57] + "..."


def _raw(f: GGUFFile, key: str, default: object) -> tuple[object, str]:
    kv = f.metadata.get(key)
    if kv is None:
        if default is REQUIRED:
            raise ModelError(f"{key}: expected a value, found none (the key is missing)")
        return default, ""
    return kv.value, kv.type_label


def read_int(f: GGUFFile, key: str, default: object = REQUIRED, lo: int = 1, hi: int = MAX_CTX) -> int:
    """Integer metadata ``key`` in ``lo..hi``; a bool, float, string or array is an error naming its type."""
    v, label = _raw(f, key, default)
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
        raise ModelError(f"{key}: expected an integer, found {label or type(v).__name__} {show(v)}")
    if not lo <= int(v) <= hi:
        raise ModelError(f"{key}: expected an integer in {lo}..{hi}, found {int(v)}")
    return int(v)


def read_float(f: GGUFFile, key: str, default: float, hi: float = 1e30, zero_ok: bool = False) -> float:
    """Finite positive float metadata ``key`` at most ``hi`` (0 too with ``zero_ok``; an integer is accepted)."""
    v, label = _raw(f, key, default)
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
        raise ModelError(f"{key}: expected a number, found {label or type(v).__name__} {show(v)}")
    x = float(v)
    if not (math.isfinite(x) and (0.0 <= x if zero_ok else 0.0 < x) and x <= hi):
        lo = "[0" if zero_ok else "(0"
        raise ModelError(f"{key}: expected a finite number in {lo}, {hi:g}], found {x!r}")
    return x


def read_ints(f: GGUFFile, key: str, n: int, default: object = REQUIRED, lo: int = 1, hi: int = MAX_CTX) -> list[int]:
    """Integer metadata ``key`` for each of ``n`` layers: one integer for all, or an array of ``n``."""
    kv = f.metadata.get(key)
    if kv is None or kv.count is None:
        return [read_int(f, key, default, lo, hi)] * n
    v = kv.value
    items = v.tolist() if isinstance(v, np.ndarray) else list(v)
    if len(items) != n:
        raise ModelError(f"{key}: expected one value or {n} (one per layer), found an array of {len(items)}")
    for x in items:
        if isinstance(x, bool | np.bool_) or not isinstance(x, int | np.integer) or not lo <= int(x) <= hi:
            raise ModelError(f"{key}: expected integers in {lo}..{hi}, found {show(x)}")
    return [int(x) for x in items]


def read_bools(f: GGUFFile, key: str, n: int) -> list[bool]:
    """A required array of ``n`` booleans (one per layer)."""
    kv = f.metadata.get(key)
    if kv is None:
        raise ModelError(f"{key}: expected a value, found none (the key is missing)")
    v = kv.value
    items = v.tolist() if isinstance(v, np.ndarray) else []
    if kv.count is None or len(items) != n or not all(isinstance(x, bool) for x in items):
        raise ModelError(f"{key}: expected an array of {n} booleans (one per layer), found {kv.type_label} "
                         f"{show(v)}")
    return [bool(x) for x in items]

