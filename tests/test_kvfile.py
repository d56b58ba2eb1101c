"""A session's cache saved to a file and restored (core/engine/kvfile.py): the restored session continues exactly
as the saved one would (attention caches, a recurrent model's state, a layer reading another's cache), and every
hostile file is refused with one line before the session is touched."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantscope.core.engine.kvfile import (
    KVFileError,
    ModelKey,
    read_session_file,
    restore_session,
    save_session,
    session_arrays,
)
from quantscope.core.engine.session import Model
from quantscope.core.fsutil import PathRefused
from quantscope.core.gguf import GGUFFile

from .arch_fixtures import vocabulary, write_fixture

PROMPT = [5, 17, 99, 3, 42, 8, 61, 7, 250, 11, 13, 400]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: Any) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("kv")
    v = vocabulary()
    return {a: write_fixture(a, d / f"{a}.gguf", vocab=v) for a in ("llama", "qwen35", "gemma4")}


def _model(path: Path) -> Model:
    return Model(GGUFFile(path), threads=1)


@pytest.mark.parametrize("arch", ["llama", "qwen35", "gemma4"])
def test_restored_session_continues_exactly(arch: str, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """Save after a prompt, restore into a fresh session: the next tokens' logits are bit for bit the saved
    session's own (qwen35: recurrent layers' state; gemma4: layers reading an earlier layer's cache)."""
    m = _model(fixtures[arch])
    key = ModelKey.of(fixtures[arch])
    a = m.session(64)
    a.forward(PROMPT, logits=False)
    out = tmp_path / "slot.bin"
    size = save_session(out, a, PROMPT, key)
    assert size == out.stat().st_size
    b = m.session(64)
    b.forward([1, 2, 3])  # something in it already: replaced whole
    saved = read_session_file(out, b, key)
    assert saved.tokens == PROMPT and saved.n_ctx == 64
    restore_session(b, saved)
    assert b.n_past == len(PROMPT)
    for t in (9, 21, 33):
        np.testing.assert_array_equal(b.forward([t]), a.forward([t]))
    if arch == "qwen35":  # the recurrent state is checkpointed where the file left it: a rewind comes back there
        b.truncate(len(PROMPT))
        assert b.n_past == len(PROMPT)


def test_empty_cache_round_trips(fixtures: dict[str, Path], tmp_path: Path) -> None:
    m = _model(fixtures["llama"])
    key = ModelKey.of(fixtures["llama"])
    s = m.session(16)
    save_session(tmp_path / "e.bin", s, [], key)
    t = m.session(16)
    restore_session(t, read_session_file(tmp_path / "e.bin", t, key))
    assert t.n_past == 0


def _saved(fixtures: dict[str, Path], tmp_path: Path) -> tuple[Model, ModelKey, Path]:
    m = _model(fixtures["llama"])
    key = ModelKey.of(fixtures["llama"])
    s = m.session(64)
    s.forward(PROMPT, logits=False)
    out = tmp_path / "good.bin"
    save_session(out, s, PROMPT, key)
    return m, key, out


def _header(path: Path) -> tuple[dict[str, Any], int]:
    data = path.read_bytes()
    hlen = struct.unpack_from("<I", data, 12)[0]
    return json.loads(data[16:16 + hlen]), hlen


def _with_header(path: Path, out: Path, change: Any) -> Path:
    """A copy of ``path`` whose JSON header is changed by ``change(h)`` (same length: padded with spaces)."""
    data = bytearray(path.read_bytes())
    h, hlen = _header(path)
    change(h)
    raw = json.dumps(h, separators=(",", ":")).encode()
    assert len(raw) <= hlen
    data[16:16 + hlen] = raw + b" " * (hlen - len(raw))
    out.write_bytes(bytes(data))
    return out


def test_hostile_files_are_refused_before_the_session_is_touched(fixtures: dict[str, Path], tmp_path: Path) -> None:
    m, key, good = _saved(fixtures, tmp_path)
    data = good.read_bytes()
    target = m.session(64)
    target.forward([7, 7, 7])
    before = {n: a.copy() for n, a in session_arrays(target).items()}

    def refused(path: Path, match: str, session: Any = target, k: ModelKey = key) -> None:
        with pytest.raises(KVFileError, match=match) as ei:
            read_session_file(path, session, k)
        assert "\n" not in str(ei.value)

    cases: list[tuple[bytes | Path, str]] = [
        (b"", "too short"),
        (b"GGUF" + data[4:], "magic"),
        (data[:12] + struct.pack("<I", 1 << 30) + data[16:], "header of"),
        (data[:16] + b"{not json" + data[25:], "not JSON"),
        (data[:8] + struct.pack("<I", 99) + data[12:], "version 99"),
    ]
    cut_points = [len(data) - 1, len(data) // 2, 200]
    cases += [(data[:n], "ends|header of|offset") for n in cut_points]
    for i, (blob, match) in enumerate(cases):
        p = tmp_path / f"bad{i}.bin"
        p.write_bytes(blob if isinstance(blob, bytes) else blob.read_bytes())
        refused(p, match)
    # another model file: refused by its identity
    refused(good, "another model", k=ModelKey("0" * 32, key.size))
    refused(good, "another model", k=ModelKey(key.identity, key.size + 1))
    # a context too small for the saved positions
    refused(good, "do not fit", session=m.session(8))
    # the header's own numbers lying
    refused(_with_header(good, tmp_path / "n.bin", lambda h: h.update(n_past=13)), "tokens for 13")
    refused(_with_header(good, tmp_path / "s.bin", lambda h: h["arrays"][0].update(shape=[12, 1, 1])), "shape")
    refused(_with_header(good, tmp_path / "d.bin", lambda h: h["arrays"][0].update(dtype="<f4")), "cache type")
    refused(_with_header(good, tmp_path / "x.bin", lambda h: h["arrays"][0].update(name="q.0")), "has not")
    refused(_with_header(good, tmp_path / "o.bin", lambda h: h["arrays"][-1].update(offset=len(data) - 8)),
            "ends inside")
    h, _ = _header(good)
    (tmp_path / "t.bin").write_bytes(data[:h["tokens"]["offset"] + 4])
    refused(tmp_path / "t.bin", "ends before")
    # token ids outside the vocabulary
    bad_tokens = bytearray(data)
    struct.pack_into("<i", bad_tokens, h["tokens"]["offset"], 10**9)
    (tmp_path / "v.bin").write_bytes(bytes(bad_tokens))
    refused(tmp_path / "v.bin", "token ids")
    # another cache type in the session (F32 against the file's F16)
    refused(good, "cache type", session=m.session(64, kv_dtype=np.float32))
    # not a regular file
    with pytest.raises(PathRefused):
        read_session_file(tmp_path, target, key)
    assert target.n_past == 3
    for n, a in session_arrays(target).items():
        np.testing.assert_array_equal(a, before[n])


def test_save_refuses_tokens_that_do_not_match(fixtures: dict[str, Path], tmp_path: Path) -> None:
    m = _model(fixtures["llama"])
    s = m.session(16)
    s.forward([1, 2, 3], logits=False)
    with pytest.raises(KVFileError, match="2 tokens for a cache of 3"):
        save_session(tmp_path / "x.bin", s, [1, 2], ModelKey.of(fixtures["llama"]))
    assert not (tmp_path / "x.bin").exists()
