"""Odd-but-legal and hostile GGUF files, written by the tests (gguf-py ``GGUFWriter`` or byte edits of a written
file): each kind is one function of a path, shared by the GUI and CLI hostile-input tests."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from quantscope.core.gguf import GGUFFile

V = gguf.GGUFValueType
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.add_bos_token", "tokenizer.chat_template")


def copy_tokenizer(w: gguf.GGUFWriter, src: Path, skip: tuple[str, ...] = ()) -> None:
    """Copy SmolLM2's tokenizer metadata (read with our reader) into ``w``."""
    with GGUFFile(src) as f:
        for key in TOKENIZER_KEYS:
            kv = f.metadata.get(key)
            if kv is None or key in skip:
                continue
            v = kv.value
            if kv.elem_type is not None:
                sub = V(int(kv.elem_type))
                items = v.to_list() if sub == V.STRING else np.asarray(v).tolist()
                w.add_key_value(key, items, V.ARRAY, sub_type=sub)
            else:
                w.add_key_value(key, v, V(int(kv.type)))


def _writer(path: Path, arch: str = "llama") -> gguf.GGUFWriter:
    return gguf.GGUFWriter(str(path), arch)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _llama_hparams(w: gguf.GGUFWriter, ctx: object = 2048, ctx_type: V = V.UINT32) -> None:
    w.add_key_value("llama.context_length", ctx, ctx_type)
    w.add_key_value("llama.embedding_length", 8, V.UINT32)
    w.add_key_value("llama.block_count", 1, V.UINT32)
    w.add_key_value("llama.attention.head_count", 2, V.UINT32)


def vocab_only(path: Path, smol: Path) -> Path:
    """A llama.cpp vocab-only file: tokenizer metadata, no tensors."""
    w = _writer(path)
    w.add_key_value("general.name", "vocab only", V.STRING)
    copy_tokenizer(w, smol)
    _finish(w)
    return path


def _small_tensors(w: gguf.GGUFWriter) -> None:
    w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.ones((8, 8), np.float16))


def zero_dim(path: Path, _smol: Path) -> Path:
    """A tensor with ne0 = 0 (no elements at all) beside a normal one."""
    w = _writer(path)
    _llama_hparams(w)
    _small_tensors(w)
    w.add_tensor("blk.0.empty.weight", np.zeros((3, 0), np.float32))
    _finish(w)
    return path


def huge_context(path: Path, _smol: Path) -> Path:
    """``llama.context_length`` = 2^40 (past any int spin box)."""
    w = _writer(path)
    _llama_hparams(w, 2**40, V.UINT64)
    _small_tensors(w)
    _finish(w)
    return path


def string_context(path: Path, _smol: Path) -> Path:
    """``llama.context_length`` stored as the string '4096'."""
    w = _writer(path)
    _llama_hparams(w, "4096", V.STRING)
    _small_tensors(w)
    _finish(w)
    return path


def wrong_types(path: Path, smol: Path) -> Path:
    """Every key the views read with an unexpected type, zero-length arrays, 1-D and 4-D tensors."""
    w = _writer(path)
    w.add_key_value("general.name", 42, V.UINT32)
    w.add_key_value("general.file_type", "Q4_K", V.STRING)
    w.add_key_value("llama.context_length", [1, 2], V.ARRAY, sub_type=V.UINT32)
    w.add_key_value("llama.embedding_length", 8.5, V.FLOAT32)
    w.add_key_value("llama.block_count", "two", V.STRING)
    w.add_key_value("llama.attention.head_count", [4, 4], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("llama.attention.head_count_kv", -3, V.INT32)
    w.add_key_value("llama.feed_forward_length", True, V.BOOL)
    w.add_key_value("llama.vocab_size", 1e30, V.FLOAT64)
    w.add_key_value("llama.rope.freq_base", "fast", V.STRING)
    w.add_key_value("llama.attention.layer_norm_rms_epsilon", [0.5], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("tokenizer.ggml.model", 7, V.UINT8)
    w.add_key_value("tokenizer.ggml.tokens", [1, 2, 3], V.ARRAY, sub_type=V.UINT32)
    w.add_key_value("tokenizer.ggml.bos_token_id", "1", V.STRING)
    w.add_key_value("tokenizer.chat_template", 5, V.INT32)
    w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.add_tensor("blk.0.four_d.weight", np.ones((2, 2, 3, 8), np.float16))
    _finish(w)
    return path


def scalars_for_arrays(path: Path, _smol: Path) -> Path:
    """Scalars where arrays belong (tokens, token types, scores, merges) and a numeric architecture name."""
    w = _writer(path)
    w.add_key_value("general.architecture", 3, V.UINT32)  # replaces "llama" (GGUFWriter wrote it first)
    w.add_key_value("tokenizer.ggml.model", "gpt2", V.STRING)
    w.add_key_value("tokenizer.ggml.tokens", 5, V.UINT32)
    w.add_key_value("tokenizer.ggml.token_type", "normal", V.STRING)
    w.add_key_value("tokenizer.ggml.scores", 1.5, V.FLOAT32)
    w.add_key_value("tokenizer.ggml.merges", 3, V.UINT32)
    _small_tensors(w)
    _finish(w)
    return path


def empty_arrays(path: Path, _smol: Path) -> Path:
    """Zero-length arrays (gguf-py refuses to write them: written with one element, then cut), no tensors."""
    keys = {"general.tags": V.STRING, "llama.attention.head_count": V.UINT32, "tokenizer.ggml.tokens": V.STRING,
            "tokenizer.ggml.scores": V.FLOAT32, "tokenizer.ggml.merges": V.STRING}
    w = _writer(path)
    w.add_key_value("llama.context_length", 128, V.UINT32)
    w.add_key_value("tokenizer.ggml.model", "llama", V.STRING)
    for key, sub in keys.items():
        w.add_key_value(key, ["x"] if sub == V.STRING else [1], V.ARRAY, sub_type=sub)
    _finish(w)
    with GGUFFile(path) as f:
        spans = sorted(((kv.value_offset, kv.end) for k, kv in f.metadata.items() if k in keys), reverse=True)
    data = bytearray(path.read_bytes())
    for start, end in spans:  # from the end, so earlier offsets stay valid
        elem = data[start : start + 4]
        data[start:end] = elem + struct.pack("<Q", 0)
    path.write_bytes(bytes(data))
    return path


def _tensor_info_offset(path: Path, name: str) -> int:
    with GGUFFile(path) as f:
        return f.tensor(name).info_offset


def _dims_field(path: Path, name: str) -> tuple[bytearray, int]:
    """The file's bytes and the offset of tensor ``name``'s n_dims field (just past its name)."""
    off = _tensor_info_offset(path, name)
    data = bytearray(path.read_bytes())
    return data, off + 8 + struct.unpack_from("<Q", data, off)[0]


def unknown_type(path: Path, smol: Path) -> Path:
    """A tensor whose type id (200) no ggml knows."""
    zero_dim(path, smol)
    data, p = _dims_field(path, "blk.0.attn_q.weight")
    n_dims = struct.unpack_from("<I", data, p)[0]
    struct.pack_into("<I", data, p + 4 + 8 * n_dims, 200)
    path.write_bytes(bytes(data))
    return path


def huge_ne(path: Path, smol: Path) -> Path:
    """A tensor claiming ne = (8, 2^40): far past the end of the file."""
    zero_dim(path, smol)
    data, p = _dims_field(path, "token_embd.weight")
    struct.pack_into("<Q", data, p + 4 + 8, 2**40)
    path.write_bytes(bytes(data))
    return path


ODD_FILES: dict[str, Callable[[Path, Path], Path]] = {
    "vocab-only": vocab_only,
    "zero-dim": zero_dim,
    "huge-context": huge_context,
    "string-context": string_context,
    "wrong-types": wrong_types,
    "empty-arrays": empty_arrays,
    "scalars-for-arrays": scalars_for_arrays,
    "unknown-type": unknown_type,
    "huge-ne": huge_ne,
}


def with_template(src: Path, dst: Path, template: str) -> Path:
    """A copy of ``src`` whose chat template is ``template`` padded with spaces to the original's byte length
    (so no offset moves)."""
    import shutil

    with GGUFFile(src) as f:
        kv = f.metadata["tokenizer.chat_template"]
        start, n = kv.value_offset + 8, kv.end - kv.value_offset - 8
    raw = template.encode("utf-8")
    assert len(raw) <= n, f"template of {len(raw)} bytes does not fit in {n}"
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        fh.seek(start)
        fh.write(raw + b" " * (n - len(raw)))
    with GGUFFile(dst) as f:
        assert f.get("tokenizer.chat_template").rstrip(" ") == template.rstrip(" ")
    return dst


def vocab_with(path: Path, smol: Path, **overrides: tuple[object, V, V | None]) -> Path:
    """A vocab-only file from SmolLM2's tokenizer with some keys replaced: ``key__with__dots=(value, type,
    sub_type)`` (double underscores stand for dots)."""
    over = {k.replace("__", "."): v for k, v in overrides.items()}
    w = _writer(path)
    copy_tokenizer(w, smol, skip=tuple(over))
    for key, (value, vtype, sub) in over.items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    _finish(w)
    return path


def spm_vocab(path: Path, pieces: list[str], types: list[int], bos: int | None = 1) -> Path:
    """A small SentencePiece-style (``llama``) vocab-only file."""
    w = _writer(path)
    w.add_key_value("tokenizer.ggml.model", "llama", V.STRING)
    w.add_key_value("tokenizer.ggml.tokens", pieces, V.ARRAY, sub_type=V.STRING)
    w.add_key_value("tokenizer.ggml.token_type", types, V.ARRAY, sub_type=V.INT32)
    w.add_key_value("tokenizer.ggml.scores", [0.0] * len(pieces), V.ARRAY, sub_type=V.FLOAT32)
    if bos is not None:
        w.add_key_value("tokenizer.ggml.bos_token_id", bos, V.INT32)
    _finish(w)
    return path
