"""A session's cache in a file: the tokens it holds and every cache and state array, to come back to without
evaluating them again (the server's ``/slots/{id}?action=save|restore``, the chat's prompt cache).

The file (``QSKVSESS``, version 1) is our own: 8 magic bytes, a little-endian u32 version and u32 header length,
a JSON header, then the data, each part at an offset the header gives (64-byte aligned). The header holds the
model file's identity (:func:`~quantscope.core.filestate.content_identity` and its size), the context it was
saved from, the number of cached positions and, per array, its name, dtype, shape and place. Arrays are saved
as they are held, whatever their dtype (F16, F32 or a quantized cache's byte blocks), so a session's storage
type saves the same way; arrays whose first axis is the position (``k.*``, ``v.*``) are saved up to the cached
positions only. :func:`read_session_file` checks everything against the session it is meant for (magic,
version, sizes, model, every array's dtype and shape, the file's length) and reads the data whole before
:func:`restore_session` touches the session; a file that fails is refused with one line (:class:`KVFileError`).
Files are written through a temporary renamed into place (:class:`~quantscope.core.fsutil.OutputSet`).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..filestate import content_identity
from ..fsutil import OutputSet, open_input
from .session import Session

MAGIC = b"QSKVSESS"
VERSION = 1
#: the JSON header's largest size (a few hundred arrays' entries)
MAX_HEADER = 1 << 20
ALIGN = 64
_PREFIX = struct.Struct("<8sII")


class KVFileError(ValueError):
    """A session file that cannot be saved or restored here; ``str()`` says why in one line."""


@dataclass(frozen=True)
class ModelKey:
    """What a saved cache belongs to: the model file's content identity and size."""

    identity: str
    size: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> ModelKey:
        p = os.fspath(path)
        return cls(content_identity(p), os.stat(p).st_size)


@dataclass
class SavedSession:
    """A checked file's content: the cached tokens and each array by name (restored by :func:`restore_session`)."""

    tokens: list[int]
    arrays: dict[str, np.ndarray]
    n_ctx: int


def session_arrays(session: Session) -> dict[str, np.ndarray]:
    """Every array that makes up ``session``'s cache, by name: ``k.L``/``v.L`` (layer ``L``'s keys and values,
    position first; a layer reading another's cache is not listed), ``conv.L``/``ssm.L`` (a recurrent layer's
    state). Only CPU sessions (:class:`Session`) keep their caches in host arrays; others are refused."""
    if type(session) is not Session:
        raise KVFileError("only CPU sessions can save or restore their cache")
    c = session.model.config
    out: dict[str, np.ndarray] = {}
    for li in range(c.n_layers):
        if li in session.ssm_state:
            out[f"conv.{li}"] = session.conv_state[li]
            out[f"ssm.{li}"] = session.ssm_state[li]
        elif c.kv_source(li) == li and not c.is_recurrent(li):
            out[f"k.{li}"] = session.k_cache[li]
            out[f"v.{li}"] = session.v_cache[li]
    return out


def _positional(name: str) -> bool:
    return name.startswith(("k.", "v."))


def _pad(n: int) -> int:
    return -n % ALIGN


def save_session(path: str | os.PathLike[str], session: Session, tokens: list[int], model: ModelKey) -> int:
    """Write ``session``'s cache holding ``tokens`` (as many as its cached positions) to ``path``, through a
    temporary renamed into place; the file's size. :class:`KVFileError` for a session that cannot be saved;
    :class:`~quantscope.core.fsutil.PathRefused` or ``OSError`` for the path."""
    arrays = session_arrays(session)
    n = session.n_past
    if len(tokens) != n:
        raise KVFileError(f"{len(tokens)} tokens for a cache of {n} positions")
    toks = np.asarray(tokens, dtype="<i4")
    parts: list[np.ndarray] = [toks]
    entries = []
    for name, a in arrays.items():
        part = np.ascontiguousarray(a[:n] if _positional(name) else a)
        entries.append({"name": name, "dtype": part.dtype.str, "shape": list(part.shape)})
        parts.append(part)

    tok_entry: dict[str, int] = {"nbytes": int(toks.nbytes)}

    def header() -> bytes:
        return json.dumps({"model": {"identity": model.identity, "size": model.size}, "n_ctx": session.n_ctx,
                           "n_past": n, "tokens": {"offset": tok_entry["offset"], "count": n},
                           "arrays": entries}, separators=(",", ":")).encode()

    # the header holds the offsets, which depend on its length: lay out again until that length stays put
    hlen, h = 0, b""
    while True:
        off = _PREFIX.size + hlen
        for e, p in zip([tok_entry, *entries], parts, strict=True):
            off += _pad(off)
            e["offset"] = off
            off += p.nbytes
        h = header()
        if len(h) == hlen:
            break
        hlen = len(h)
    total = 0
    with OutputSet([("cache file", path)], make_dirs=False) as out:
        out.write_bytes("cache file", _PREFIX.pack(MAGIC, VERSION, len(h)) + h)
        total = _PREFIX.size + len(h)
        for e, p in zip([tok_entry, *entries], parts, strict=True):
            out.write_bytes("cache file", b"\0" * (e["offset"] - total))
            out.write_bytes("cache file", memoryview(p.reshape(-1).view(np.uint8)))
            total = e["offset"] + p.nbytes
        out.commit()
    return total


def _int(v: object, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise KVFileError(f"{what} is not a whole number in {lo}..{hi}")
    return v


def _read_head(fh: BinaryIO, model: ModelKey) -> tuple[dict[str, Any], int, int]:
    """The checked header of an open cache file (magic, version, its JSON, the model, the counts, the tokens'
    place), its number of cached positions and the offset where its data may begin."""
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(_PREFIX.size)
    if len(head) < _PREFIX.size:
        raise KVFileError("not a session cache file (too short)")
    magic, version, hlen = _PREFIX.unpack(head)
    if magic != MAGIC:
        raise KVFileError("not a session cache file (wrong magic bytes)")
    if version != VERSION:
        raise KVFileError(f"session cache file version {version}; this version reads {VERSION}")
    if hlen > MAX_HEADER or _PREFIX.size + hlen > size:
        raise KVFileError(f"header of {hlen} bytes in a file of {size}")
    try:
        h = json.loads(fh.read(hlen).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise KVFileError("the header is not JSON") from None
    if not isinstance(h, dict) or not isinstance(h.get("model"), dict) or not isinstance(h.get("arrays"), list) \
            or not isinstance(h.get("tokens"), dict):
        raise KVFileError("the header lacks model, tokens or arrays")
    m = h["model"]
    if m.get("identity") != model.identity or m.get("size") != model.size:
        raise KVFileError("the cache was saved with another model file")
    _int(h.get("n_ctx"), "n_ctx", 1)
    n = _int(h.get("n_past"), "n_past")
    if _int(h["tokens"].get("count"), "the token count") != n:
        raise KVFileError(f"{h['tokens'].get('count')} tokens for {n} cached positions")
    end = _PREFIX.size + hlen
    tok_off = _int(h["tokens"].get("offset"), "the tokens' offset", end, size)
    if tok_off + 4 * n > size:
        raise KVFileError(f"the file ends before its tokens ({size} bytes)")
    return h, n, end


def _read_tokens(fh: BinaryIO, h: dict[str, Any], n: int, n_vocab: int) -> list[int]:
    fh.seek(h["tokens"]["offset"])
    tokens = np.frombuffer(fh.read(4 * n), dtype="<i4")
    if tokens.size != n:
        raise KVFileError("the file ends inside its tokens")
    if n and (tokens.min() < 0 or tokens.max() >= n_vocab):
        raise KVFileError(f"token ids outside 0..{n_vocab - 1}")
    return [int(t) for t in tokens]


def read_tokens(path: str | os.PathLike[str], model: ModelKey, n_vocab: int) -> list[int]:
    """The tokens a cache file of the model file ``model`` holds (its header checked, its arrays not read):
    what a prompt cache compares prompts with before reading a file whole."""
    with os.fdopen(open_input(path), "rb") as fh:
        h, n, _end = _read_head(fh, model)
        return _read_tokens(fh, h, n, n_vocab)


def read_session_file(path: str | os.PathLike[str], session: Session, model: ModelKey) -> SavedSession:
    """Read and check the cache file ``path`` for ``session`` (of the model file ``model``): its tokens and
    arrays, each matching the session's own in name, dtype and shape; nothing of the session is touched.
    :class:`KVFileError` with the first problem found (:class:`~quantscope.core.fsutil.PathRefused` for a
    path that is not a readable regular file)."""
    want = session_arrays(session)
    with os.fdopen(open_input(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        h, n, end = _read_head(fh, model)
        if n > session.n_ctx:
            raise KVFileError(f"{n} cached positions do not fit this context of {session.n_ctx}")
        if len(h["arrays"]) != len(want):
            raise KVFileError(f"{len(h['arrays'])} arrays; this model's cache has {len(want)}")
        plan: list[tuple[str, np.dtype, tuple[int, ...], int]] = []
        for e in h["arrays"]:
            if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e["name"] not in want:
                raise KVFileError(f"an array this model's cache has not: {str(e)[:60]}")
            name = e["name"]
            mine = want[name]
            expect_shape = (n, *mine.shape[1:]) if _positional(name) else mine.shape
            dt = e.get("dtype")
            if dt != mine.dtype.str:  # (compared as text: no dtype is made from the file's words)
                raise KVFileError(f"{name}: {str(dt)[:20]} in the file, {mine.dtype} here (another cache type)")
            shape = e.get("shape")
            if not isinstance(shape, list) or tuple(shape) != expect_shape:
                raise KVFileError(f"{name}: shape {str(shape)[:40]} in the file, {list(expect_shape)} here")
            nbytes = int(np.prod(expect_shape, dtype=np.int64)) * mine.dtype.itemsize
            off = _int(e.get("offset"), f"{name}'s offset", end, size)
            if off + nbytes > size:
                raise KVFileError(f"the file ends inside {name} ({size} bytes; truncated?)")
            plan.append((name, mine.dtype, expect_shape, off))
        if len({e[0] for e in plan}) != len(plan):
            raise KVFileError("an array is listed twice")
        tokens = _read_tokens(fh, h, n, session.model.config.n_vocab)
        arrays: dict[str, np.ndarray] = {}
        for name, dt, shape, off in plan:
            fh.seek(off)
            count = int(np.prod(shape, dtype=np.int64))
            data = fh.read(count * dt.itemsize)
            if len(data) != count * dt.itemsize:
                raise KVFileError(f"the file ends inside {name} (truncated?)")
            a = np.frombuffer(data, dtype=dt).reshape(shape)
            if dt.kind == "f" and not np.isfinite(a).all():
                raise KVFileError(f"{name} holds values that are not finite")
            arrays[name] = a
    return SavedSession(tokens, arrays, int(h["n_ctx"]))


def restore_session(session: Session, saved: SavedSession) -> None:
    """Put a checked file's content (:func:`read_session_file` for this session) into ``session``: its caches
    and states, ``n_past`` the saved tokens' count, and a recurrent model's checkpoint there."""
    want = session_arrays(session)
    if set(want) != set(saved.arrays) or len(saved.tokens) > session.n_ctx:
        raise KVFileError("the saved cache was read for another session")
    n = len(saved.tokens)
    session.reset()
    for name, a in saved.arrays.items():
        if _positional(name):
            want[name][:n] = a
        else:
            want[name][...] = a
    session.n_past = n
    session.checkpoint()
