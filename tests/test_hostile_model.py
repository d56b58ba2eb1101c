"""Hostile model files: metadata and tensors the native engine must never trust.

A generated corpus: small synthetic llama / qwen2 / gemma3 GGUFs (written with gguf-py's ``GGUFWriter``, random
valid weights, a byte-level tokenizer) with ONE hyperparameter or tensor changed per case. Each case must be
refused at load with :class:`ModelError` / :class:`UnsupportedModel` naming the key (and the expected and found
values), and the CLI must say so on one stderr line with exit status 2. The C entry points are called directly
with bad sizes and must return their error codes without writing anything. tests/run_sanitized.sh runs this file
on the ASan/UBSan build.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from quantscope.core.engine.reference import reference_logits
from quantscope.core.engine.session import Model
from quantscope.core.model import ModelError, UnsupportedModel, bind_weights, check_weights, read_config
from quantscope.core.native import ffi, lib, nn
from quantscope.core.native.kernels import KernelError
from quantscope.core.tokenizer import bytes_to_unicode

VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType
DELETE = object()

SPECS: dict[str, dict[str, Any]] = {
    "llama": dict(E=64, H=4, KV=2, HD=16, F=128, L=2),
    "qwen2": dict(E=64, H=4, KV=2, HD=16, F=128, L=2),
    "gemma3": dict(E=64, H=4, KV=1, HD=32, F=128, L=2),
}
TOKENS = [bytes_to_unicode()[b] for b in range(256)] + ["hi", "<|endoftext|>"]
N_VOCAB = len(TOKENS)


def base_meta(arch: str) -> dict[str, tuple[Any, Any]]:
    s = SPECS[arch]
    p = arch + "."
    m: dict[str, tuple[Any, Any]] = {
        p + "block_count": (s["L"], VT.UINT32),
        p + "context_length": (256, VT.UINT32),
        p + "embedding_length": (s["E"], VT.UINT32),
        p + "feed_forward_length": (s["F"], VT.UINT32),
        p + "attention.head_count": (s["H"], VT.UINT32),
        p + "attention.head_count_kv": (s["KV"], VT.UINT32),
        p + "rope.freq_base": (10000.0, VT.FLOAT32),
        p + "attention.layer_norm_rms_epsilon": (1e-5, VT.FLOAT32),
        "tokenizer.ggml.model": ("gpt2", VT.STRING),
        "tokenizer.ggml.pre": ("default", VT.STRING),
        "tokenizer.ggml.tokens": (TOKENS, VT.ARRAY),
        "tokenizer.ggml.token_type": ([1] * (N_VOCAB - 1) + [3], VT.ARRAY),
        "tokenizer.ggml.merges": (["h i"], VT.ARRAY),
        "tokenizer.ggml.eos_token_id": (N_VOCAB - 1, VT.UINT32),
    }
    if arch == "llama":
        m[p + "rope.dimension_count"] = (s["HD"], VT.UINT32)
        m[p + "vocab_size"] = (N_VOCAB, VT.UINT32)
    if arch == "gemma3":
        m[p + "attention.key_length"] = (s["HD"], VT.UINT32)
        m[p + "attention.value_length"] = (s["HD"], VT.UINT32)
        m[p + "attention.sliding_window"] = (8, VT.UINT32)
    return m


def base_tensors(arch: str, seed: int = 0) -> dict[str, Any]:
    """name -> float32 array (numpy shape: rows x row length) or (quantized bytes, type)."""
    s = SPECS[arch]
    E, H, KV, HD, F = s["E"], s["H"], s["KV"], s["HD"], s["F"]
    rng = np.random.default_rng(seed)

    def mat(rows: int, k: int) -> np.ndarray:
        return (rng.standard_normal((rows, k)) * (0.5 / math.sqrt(k))).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, Any] = {"token_embd.weight": mat(N_VOCAB, E), "output_norm.weight": norm(E)}
    for i in range(s["L"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = norm(E)
        t[b + "attn_q.weight"] = (gguf.quants.quantize(mat(H * HD, E), QT.Q8_0), QT.Q8_0)
        t[b + "attn_k.weight"] = mat(KV * HD, E)
        t[b + "attn_v.weight"] = mat(KV * HD, E)
        t[b + "attn_output.weight"] = mat(E, H * HD)
        t[b + "ffn_norm.weight"] = norm(E)
        t[b + "ffn_gate.weight"] = mat(F, E)
        t[b + "ffn_up.weight"] = mat(F, E)
        t[b + "ffn_down.weight"] = mat(E, F).astype(np.float16)
        if arch == "qwen2":
            t[b + "attn_q.bias"] = norm(H * HD) - 1
            t[b + "attn_k.bias"] = norm(KV * HD) - 1
            t[b + "attn_v.bias"] = norm(KV * HD) - 1
        if arch == "gemma3":
            t[b + "attn_q_norm.weight"] = norm(HD)
            t[b + "attn_k_norm.weight"] = norm(HD)
            t[b + "post_attention_norm.weight"] = norm(E)
            t[b + "post_ffw_norm.weight"] = norm(E)
    if arch == "qwen2":
        t["output.weight"] = mat(N_VOCAB, E)
    return t


def write_model(path: Path, arch: str, meta: dict[str, Any] | None = None,
                tensors: dict[str, Any] | None = None) -> Path:
    """A synthetic model; ``meta``/``tensors`` override (or, with DELETE, remove) entries of the valid one."""
    m = base_meta(arch)
    t = base_tensors(arch)
    for src, dst in ((meta or {}, m), (tensors or {}, t)):
        for k, v in src.items():
            if v is DELETE:
                dst.pop(k, None)
            else:
                dst[k] = v
    w = gguf.GGUFWriter(str(path), arch)
    for k, (v, vt) in m.items():
        if vt == VT.ARRAY:
            w.add_array(k, v)
        else:
            w.add_key_value(k, v, vt)
    for name, a in t.items():
        if isinstance(a, tuple):
            w.add_tensor(name, a[0], raw_dtype=a[1])
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


_valid: dict[str, Path] = {}


def valid_model(arch: str, d: Path) -> Path:
    if arch not in _valid:
        _valid[arch] = write_model(d / f"valid-{arch}.gguf", arch)
    return _valid[arch]


# ------------------------------------------------------------------------------------------ positive controls
@pytest.mark.parametrize("arch", list(SPECS))
def test_valid_synthetic_models_run_and_match_the_reference(arch, corpus_dir):
    model = Model.load(str(valid_model(arch, corpus_dir)), threads=2)
    assert model.config.n_layers == SPECS[arch]["L"] and model.config.n_vocab == N_VOCAB
    s = model.session(32)
    ids = [5, 104, 256, 7, 12]
    logits = s.forward(ids, all_logits=True)
    ref = reference_logits(model.config, model.weights, ids)
    assert np.isfinite(logits).all()
    assert np.allclose(logits, ref, rtol=2e-2, atol=2e-2), np.abs(logits - ref).max()


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscope.cli", *argv], capture_output=True, text=True,
                          timeout=120)


def test_valid_synthetic_model_generates_from_the_cli(corpus_dir):
    res = cli("generate", str(valid_model("llama", corpus_dir)), "-p", "hi", "-n", "2", "--temp", "0",
              "--backend", "cpu")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr


# ------------------------------------------------------------------------------------------ metadata corpus
def case(arch: str, key: str, value: Any, vtype: Any, expect: str | tuple[str, ...]) -> Any:
    keyname = key if key.startswith(("tokenizer.", "general.")) else f"{arch}.{key}"
    label = f"{arch}:{key}={value!r}:{getattr(vtype, 'name', 'deleted')}"
    return pytest.param(arch, {keyname: value if value is DELETE else (value, vtype)},
                         (expect,) if isinstance(expect, str) else expect, id=label[:80])


EMB, FF, HC, HKV = "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv"
KL, RD, BC, EPS = "attention.key_length", "rope.dimension_count", "block_count", "attention.layer_norm_rms_epsilon"
BASE, CTX, SW = "rope.freq_base", "context_length", "attention.sliding_window"

META_CASES = [
    # embedding_length: larger, smaller, zero, negative, huge, mistyped
    case("llama", EMB, 96, VT.UINT32, ("llama.embedding_length", "expected 64", "found 96")),
    case("llama", EMB, 32, VT.UINT32, ("llama.embedding_length", "expected 64", "found 32")),
    case("llama", EMB, 0, VT.UINT32, ("llama.embedding_length", "found 0")),
    case("llama", EMB, -64, VT.INT32, ("llama.embedding_length", "found -64")),
    case("llama", EMB, 2**40, VT.UINT64, ("llama.embedding_length", f"found {2**40}")),
    case("llama", EMB, "64", VT.STRING, ("llama.embedding_length", "expected an integer", "STRING")),
    case("llama", EMB, 64.0, VT.FLOAT32, ("llama.embedding_length", "expected an integer", "FLOAT32")),
    case("llama", EMB, True, VT.BOOL, ("llama.embedding_length", "expected an integer", "BOOL")),
    case("llama", EMB, DELETE, None, ("llama.embedding_length", "missing")),
    case("gemma3", EMB, 128, VT.UINT32, ("gemma3.embedding_length", "expected 64", "found 128")),
    # feed_forward_length
    case("llama", FF, 256, VT.UINT32, ("llama.feed_forward_length", "expected blk.0.ffn_gate.weight to be 256 x 64",
                                       "found 128 x 64")),
    case("llama", FF, 64, VT.UINT32, ("llama.feed_forward_length", "found 128 x 64")),
    case("qwen2", FF, 0, VT.UINT32, ("qwen2.feed_forward_length", "found 0")),
    case("gemma3", FF, 2**31, VT.UINT64, ("gemma3.feed_forward_length", f"found {2**31}")),
    # one value per layer is allowed (llama.cpp's get_key_or_arr), of the right count and each checked
    case("llama", FF, [128], VT.ARRAY, ("llama.feed_forward_length", "one per layer", "array of 1")),
    case("llama", FF, [128, 256], VT.ARRAY, ("llama.feed_forward_length", "blk.1.ffn_gate.weight to be 256 x 64")),
    case("llama", FF, [128, 0], VT.ARRAY, ("llama.feed_forward_length", "expected integers in 1..", "0")),
    case("llama", FF, ["a", "b"], VT.ARRAY, ("llama.feed_forward_length", "expected integers")),
    case("llama", "attention.head_count_kv", [2, 3], VT.ARRAY,
         ("llama.attention.head_count_kv", "divisor", "layer 1", "found 3")),
    # head counts
    case("llama", HC, 0, VT.UINT32, ("llama.attention.head_count", "found 0")),
    case("llama", HC, 3, VT.UINT32, ("llama.attention.head_count", "divisor", "no llama.attention.key_length",
                                    "found 3")),
    case("llama", HC, 8, VT.UINT32, ("llama.rope.dimension_count", "llama.attention.head_count", "found 16")),
    case("llama", HC, 2, VT.UINT32, ("llama.attention.head_count = 2", "blk.0.attn_k.weight", "found 32 x 64")),
    case("qwen2", HC, 5000, VT.UINT32, ("qwen2.attention.head_count", "found 5000")),
    case("gemma3", HC, 2, VT.UINT32, ("gemma3.attention.head_count = 2", "blk.0.attn_q.weight", "found 128 x 64")),
    case("llama", HKV, 0, VT.UINT32, ("llama.attention.head_count_kv", "found 0")),
    case("llama", HKV, 3, VT.UINT32, ("llama.attention.head_count_kv", "divisor", "found 3")),
    case("llama", HKV, 4, VT.UINT32, ("llama.attention.head_count_kv = 4", "blk.0.attn_k.weight", "32 x 64")),
    case("qwen2", HKV, 1, VT.UINT32, ("qwen2.attention.head_count_kv = 1", "blk.0.attn_k.weight")),
    case("gemma3", HKV, -1, VT.INT32, ("gemma3.attention.head_count_kv", "found -1")),
    case("gemma3", HKV, "1", VT.STRING, ("gemma3.attention.head_count_kv", "expected an integer")),
    # head dimension (key_length) and rope dimension
    case("gemma3", KL, 16, VT.UINT32, ("gemma3.attention.value_length", "gemma3.attention.key_length", "found 32")),
    case("gemma3", KL, 64, VT.UINT32, ("gemma3.attention.key_length",)),
    case("gemma3", KL, 0, VT.UINT32, ("gemma3.attention.key_length", "found 0")),
    case("gemma3", KL, 33, VT.UINT32, ("gemma3.attention.key_length", "even", "found 33")),
    case("gemma3", KL, 4096, VT.UINT32, ("gemma3.attention.key_length", "found 4096")),
    case("gemma3", "attention.value_length", 16, VT.UINT32, ("gemma3.attention.value_length", "expected 32",
                                                             "found 16")),
    case("llama", KL, 32, VT.UINT32, ("llama.attention.key_length = 32", "blk.0.attn_q.weight")),
    case("llama", RD, 18, VT.UINT32, ("llama.rope.dimension_count", "at most the head dimension 16", "found 18")),
    case("llama", RD, 600, VT.UINT32, ("llama.rope.dimension_count", "found 600")),
    case("llama", RD, 15, VT.UINT32, ("llama.rope.dimension_count", "even", "found 15")),
    case("llama", RD, 0, VT.UINT32, ("llama.rope.dimension_count", "found 0")),
    case("llama", RD, -2, VT.INT32, ("llama.rope.dimension_count", "found -2")),
    case("llama", RD, 16.0, VT.FLOAT64, ("llama.rope.dimension_count", "expected an integer", "FLOAT64")),
    case("qwen2", RD, 64, VT.UINT32, ("qwen2.rope.dimension_count", "found 64")),
    case("gemma3", RD, 34, VT.UINT32, ("gemma3.rope.dimension_count", "found 34")),
    # block_count against the blk.N present
    case("llama", BC, 3, VT.UINT32, ("llama.block_count", "expected 2", "found 3")),
    case("llama", BC, 1, VT.UINT32, ("llama.block_count", "expected 2", "found 1")),
    case("qwen2", BC, 0, VT.UINT32, ("qwen2.block_count", "found 0")),
    case("gemma3", BC, 2**32 - 1, VT.UINT32, ("gemma3.block_count", f"found {2**32 - 1}")),
    case("llama", BC, DELETE, None, ("llama.block_count", "missing")),
    # epsilon and RoPE base: finite and positive
    case("llama", EPS, float("nan"), VT.FLOAT32, ("llama.attention.layer_norm_rms_epsilon", "finite", "nan")),
    case("llama", EPS, float("inf"), VT.FLOAT32, ("llama.attention.layer_norm_rms_epsilon", "inf")),
    case("qwen2", EPS, 0.0, VT.FLOAT32, ("qwen2.attention.layer_norm_rms_epsilon", "found 0.0")),
    case("gemma3", EPS, -1e-6, VT.FLOAT32, ("gemma3.attention.layer_norm_rms_epsilon", "found -")),
    case("llama", EPS, "1e-5", VT.STRING, ("llama.attention.layer_norm_rms_epsilon", "expected a number", "STRING")),
    case("llama", BASE, -10000.0, VT.FLOAT32, ("llama.rope.freq_base", "found -10000.0")),
    case("qwen2", BASE, 0.0, VT.FLOAT32, ("qwen2.rope.freq_base", "found 0.0")),
    case("gemma3", BASE, float("nan"), VT.FLOAT64, ("gemma3.rope.freq_base", "nan")),
    case("llama", BASE, float("-inf"), VT.FLOAT32, ("llama.rope.freq_base", "-inf")),
    case("llama", BASE, False, VT.BOOL, ("llama.rope.freq_base", "expected a number", "BOOL")),
    # context, window, vocabulary
    case("llama", CTX, 0, VT.UINT32, ("llama.context_length", "found 0")),
    case("qwen2", CTX, -5, VT.INT64, ("qwen2.context_length", "found -5")),
    case("llama", CTX, 2**40, VT.UINT64, ("llama.context_length", f"found {2**40}")),
    case("gemma3", SW, -1, VT.INT32, ("gemma3.attention.sliding_window", "found -1")),
    case("gemma3", SW, "8", VT.STRING, ("gemma3.attention.sliding_window", "expected an integer")),
    case("llama", "vocab_size", N_VOCAB + 1, VT.UINT32, ("llama.vocab_size", f"expected {N_VOCAB}",
                                                       f"found {N_VOCAB + 1}")),
    case("llama", "vocab_size", 0, VT.UINT32, ("llama.vocab_size", "found 0")),
    case("llama", "tokenizer.ggml.tokens", [*TOKENS, "extra"], VT.ARRAY,
         ("tokenizer.ggml.tokens", f"at most {N_VOCAB}", f"found {N_VOCAB + 1}")),
]


def load_error(path: Path) -> Exception:
    with pytest.raises(UnsupportedModel) as ei:
        Model.load(str(path), threads=2)
    return ei.value


@pytest.mark.parametrize(("arch", "meta", "expect"), META_CASES)
def test_bad_metadata_is_refused_naming_the_key(arch, meta, expect, tmp_path):
    path = write_model(tmp_path / "m.gguf", arch, meta=meta)
    before = path.read_bytes()
    err = load_error(path)
    assert isinstance(err, ModelError), repr(err)
    for part in expect:
        assert part in str(err), (part, str(err))
    assert path.read_bytes() == before  # never written to
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # no debris


# ------------------------------------------------------------------------------------------ tensor corpus
def _f32(*shape: int) -> np.ndarray:
    return np.full(shape, 0.01, np.float32)


def _blk_copy(arch: str, src: int, dst: int) -> dict[str, Any]:
    return {k.replace(f"blk.{src}.", f"blk.{dst}."): v for k, v in base_tensors(arch).items()
            if k.startswith(f"blk.{src}.")}


def _without_blk(arch: str, i: int) -> dict[str, Any]:
    return {k: DELETE for k in base_tensors(arch) if k.startswith(f"blk.{i}.")}


TENSOR_CASES = [
    pytest.param("llama", {}, _without_blk("llama", 1), ModelError, ("llama.block_count", "expected 1", "found 2"),
                 id="llama-missing-layer"),
    pytest.param("llama", {}, _blk_copy("llama", 1, 2), ModelError, ("llama.block_count", "expected 3", "found 2"),
                 id="llama-extra-layer"),
    pytest.param("gemma3", {"gemma3.block_count": (3, VT.UINT32)}, {**_blk_copy("gemma3", 1, 2),
                 **_without_blk("gemma3", 1)}, ModelError, ("gemma3.block_count", "blk.1 has no tensors"),
                 id="gemma3-layer-gap"),
    pytest.param("llama", {}, {"blk.0.attn_q.weight": _f32(48, 64)}, ModelError,
                 ("blk.0.attn_q.weight to be 64 x 64", "found 48 x 64"), id="llama-q-rows"),
    pytest.param("llama", {}, {"blk.1.attn_k.weight": _f32(32, 48)}, ModelError,
                 ("llama.embedding_length", "blk.1.attn_k.weight to be 32 x 64", "found 32 x 48"), id="llama-k-cols"),
    pytest.param("qwen2", {}, {"blk.0.attn_v.weight": _f32(16, 64)}, ModelError,
                 ("blk.0.attn_v.weight to be 32 x 64", "found 16 x 64"), id="qwen2-v-rows"),
    pytest.param("gemma3", {}, {"blk.1.attn_output.weight": _f32(64, 64)}, ModelError,
                 ("blk.1.attn_output.weight to be 64 x 128", "found 64 x 64"), id="gemma3-o-cols"),
    pytest.param("llama", {}, {"blk.0.ffn_up.weight": _f32(96, 64)}, ModelError,
                 ("llama.feed_forward_length", "blk.0.ffn_up.weight to be 128 x 64"), id="llama-up-rows"),
    pytest.param("qwen2", {}, {"blk.1.ffn_down.weight": _f32(64, 96)}, ModelError,
                 ("qwen2.feed_forward_length", "blk.1.ffn_down.weight to be 64 x 128", "found 64 x 96"),
                 id="qwen2-down-cols"),
    pytest.param("gemma3", {}, {"blk.0.ffn_gate.weight": _f32(128, 32)}, ModelError,
                 ("gemma3.embedding_length", "blk.0.ffn_gate.weight"), id="gemma3-gate-cols"),
    pytest.param("llama", {}, {"token_embd.weight": _f32(2, N_VOCAB, 64)}, ModelError,
                 ("token_embd.weight", "2 dimensions"), id="llama-embd-3d"),
    pytest.param("qwen2", {}, {"output.weight": _f32(N_VOCAB - 2, 64)}, ModelError,
                 ("output.weight to be 258 x 64", "found 256 x 64"), id="qwen2-output-rows"),
    pytest.param("llama", {}, {"output.weight": _f32(N_VOCAB, 32)}, ModelError,
                 ("llama.embedding_length", "output.weight"), id="llama-output-cols"),
    pytest.param("qwen2", {}, {"token_embd.weight": _f32(200, 64), "output.weight": _f32(200, 64)}, ModelError,
                 ("tokenizer.ggml.tokens", "at most 200 tokens", f"found {N_VOCAB}"), id="qwen2-tokens-vs-rows"),
    # norms and biases of the wrong length
    pytest.param("llama", {}, {"blk.0.attn_norm.weight": _f32(63)}, ModelError,
                 ("llama.embedding_length", "blk.0.attn_norm.weight to hold 64 values", "found 63"),
                 id="llama-attn-norm"),
    pytest.param("llama", {}, {"blk.1.ffn_norm.weight": _f32(65)}, ModelError,
                 ("blk.1.ffn_norm.weight to hold 64 values", "found 65"), id="llama-ffn-norm"),
    pytest.param("qwen2", {}, {"output_norm.weight": _f32(32)}, ModelError,
                 ("output_norm.weight to hold 64 values", "found 32"), id="qwen2-output-norm"),
    pytest.param("gemma3", {}, {"blk.0.attn_q_norm.weight": _f32(16)}, ModelError,
                 ("gemma3.attention.key_length", "blk.0.attn_q_norm.weight to hold 32 values", "found 16"),
                 id="gemma3-q-norm"),
    pytest.param("gemma3", {}, {"blk.1.attn_k_norm.weight": _f32(64)}, ModelError,
                 ("blk.1.attn_k_norm.weight to hold 32 values", "found 64"), id="gemma3-k-norm"),
    pytest.param("gemma3", {}, {"blk.1.post_ffw_norm.weight": _f32(63)}, ModelError,
                 ("blk.1.post_ffw_norm.weight to hold 64 values",), id="gemma3-post-ffw-norm"),
    pytest.param("gemma3", {}, {"blk.0.post_attention_norm.weight": _f32(2, 64)}, ModelError,
                 ("blk.0.post_attention_norm.weight", "1 dimension"), id="gemma3-post-attn-norm-2d"),
    pytest.param("qwen2", {}, {"blk.0.attn_q.bias": _f32(63)}, ModelError,
                 ("blk.0.attn_q.bias to hold 64 values", "found 63"), id="qwen2-q-bias"),
    pytest.param("qwen2", {}, {"blk.1.attn_k.bias": DELETE}, ModelError, ("blk.1.attn_q/k/v.bias", "all three"),
                 id="qwen2-missing-k-bias"),
    pytest.param("llama", {}, {"blk.0.attn_q_norm.weight": _f32(16)}, UnsupportedModel,
                 ("llama: the engine does not use the tensor(s) blk.0.attn_q_norm.weight",), id="llama-q-norm"),
    # tensors missing or of types the kernels cannot run
    pytest.param("gemma3", {}, {"blk.1.attn_q_norm.weight": DELETE}, UnsupportedModel,
                 ("missing tensor blk.1.attn_q_norm.weight",), id="gemma3-missing-q-norm"),
    pytest.param("llama", {}, {"token_embd.weight": DELETE}, UnsupportedModel, ("missing tensor token_embd.weight",),
                 id="llama-missing-embd"),
    pytest.param("llama", {}, {"blk.1.ffn_gate.weight": np.zeros((128, 64), np.int8)},
                 UnsupportedModel, ("blk.1.ffn_gate.weight is I8", "no kernel"), id="llama-i8-weight"),
]


@pytest.mark.parametrize(("arch", "meta", "tensors", "exc", "expect"), TENSOR_CASES)
def test_bad_tensors_are_refused_naming_the_problem(arch, meta, tensors, exc, expect, tmp_path):
    path = write_model(tmp_path / "m.gguf", arch, meta=meta, tensors=tensors)
    err = load_error(path)
    assert type(err) is exc, repr(err)
    for part in expect:
        assert part in str(err), (part, str(err))


# ------------------------------------------------------------------------------------------ CLI outcome
CLI_CASES = [
    ("llama", {"llama.embedding_length": (96, VT.UINT32)}, {}, "llama.embedding_length"),
    ("llama", {"llama.feed_forward_length": (256, VT.UINT32)}, {}, "llama.feed_forward_length"),
    ("gemma3", {"gemma3.attention.key_length": (64, VT.UINT32)}, {}, "gemma3.attention.key_length"),
    ("llama", {"llama.rope.dimension_count": (600, VT.UINT32)}, {}, "llama.rope.dimension_count"),
    ("qwen2", {"qwen2.attention.head_count": (0, VT.UINT32)}, {}, "qwen2.attention.head_count"),
    ("llama", {"llama.attention.head_count_kv": (3, VT.UINT32)}, {}, "llama.attention.head_count_kv"),
    ("llama", {"llama.block_count": (3, VT.UINT32)}, {}, "llama.block_count"),
    ("llama", {}, _without_blk("llama", 1), "llama.block_count"),
    ("llama", {"llama.attention.layer_norm_rms_epsilon": (float("nan"), VT.FLOAT32)}, {},
     "llama.attention.layer_norm_rms_epsilon"),
    ("qwen2", {"qwen2.rope.freq_base": (-1e4, VT.FLOAT32)}, {}, "qwen2.rope.freq_base"),
    ("gemma3", {}, {"blk.0.attn_q_norm.weight": _f32(16)}, "blk.0.attn_q_norm.weight"),
    ("llama", {"llama.embedding_length": ("64", VT.STRING)}, {}, "llama.embedding_length"),
]


@pytest.mark.parametrize(("arch", "meta", "tensors", "key"), CLI_CASES, ids=[c[3] + "-" + c[0] for c in CLI_CASES])
def test_cli_generate_refuses_with_one_error_line(arch, meta, tensors, key, tmp_path):
    path = write_model(tmp_path / "m.gguf", arch, meta=meta, tensors=tensors)
    res = cli("generate", str(path), "-p", "hi", "-n", "2", "--backend", "cpu")
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscope: error:"), res.stderr
    assert key in lines[0] and "Traceback" not in res.stderr
    assert res.stdout == ""


# ------------------------------------------------------------------------------------------ unvalidated paths
def test_reference_forward_refuses_an_unchecked_config(corpus_dir):
    import dataclasses

    model = Model.load(str(valid_model("llama", corpus_dir)), threads=1)
    bad = dataclasses.replace(model.config, rope_dim=64)
    with pytest.raises(ModelError, match=r"rope\.dimension_count"):
        reference_logits(bad, model.weights, [1, 2])
    with pytest.raises(ModelError, match="head_count_kv"):
        reference_logits(dataclasses.replace(model.config, n_head_kv=3), model.weights, [1, 2])
    with pytest.raises(ValueError, match="token ids"):
        reference_logits(model.config, model.weights, [N_VOCAB])


def test_model_refuses_weights_that_disagree_with_their_config(corpus_dir):
    import dataclasses

    from quantscope.core.gguf import GGUFFile

    f = GGUFFile(valid_model("qwen2", corpus_dir))
    w = bind_weights(f, read_config(f))
    check_weights(w)
    for bad in (dict(n_ff=64), dict(head_dim=8), dict(rms_eps=float("nan")), dict(rope_base=-1.0),
                dict(n_layers=3), dict(rope_dim=6 + 1)):
        with pytest.raises(ModelError):
            Model(None, 1, weights=dataclasses.replace(w, config=dataclasses.replace(w.config, **bad)))
    lw = w.layers[1]
    for bad_layer in (dataclasses.replace(lw, wq=dataclasses.replace(lw.wq, data=lw.wq.data[:-1])),
                      dataclasses.replace(lw, w_up=dataclasses.replace(lw.w_up, data=lw.w_up.data.view(np.float32))),
                      dataclasses.replace(lw, bk=lw.bk.astype(np.float64)),
                      dataclasses.replace(lw, ffn_norm=None)):
        with pytest.raises(ModelError, match=r"^blk\.1\.(attn_q|ffn_up|attn_k|ffn_norm)"):
            Model(None, 1, weights=dataclasses.replace(w, layers=[w.layers[0], bad_layer]))
    m = Model(None, 1, weights=w)
    for n_ctx in (0, -1, 2**40, 1.5):
        with pytest.raises(ValueError, match="context size"):
            m.session(n_ctx)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ C entry points
def _fp(a: np.ndarray) -> Any:
    return ffi.cast("float *", ffi.from_buffer(a))


def _ip(a: np.ndarray) -> Any:
    return ffi.cast("int32_t *", ffi.from_buffer(a))


def test_qs_rope_validates_rot_dim_and_writes_nothing_on_error():
    x = np.ones((2, 3, 16), np.float32)
    pos = np.array([0, 5], np.int32)
    for rot, want in ((17, lib.QS_ERR_HEADS), (18, lib.QS_ERR_HEADS), (0, lib.QS_ERR_HEADS),
                      (-2, lib.QS_ERR_HEADS), (2048, lib.QS_ERR_HEADS)):
        assert lib.qs_rope(_fp(x), 2, 3, 16, rot, _ip(pos), 1e4, 1.0, 0, ffi.NULL) == want
    big = lib.qs_rope(_fp(x), 2, 3, 2048, 2048, _ip(pos), 1e4, 1.0, 1, ffi.NULL)  # head_dim > 1024
    assert big == lib.QS_ERR_HEADS
    assert lib.qs_rope(_fp(x), -1, 3, 16, 16, _ip(pos), 1e4, 1.0, 0, ffi.NULL) == lib.QS_ERR_SIZE
    assert lib.qs_rope(_fp(x), 2, -3, 16, 16, _ip(pos), 1e4, 1.0, 0, ffi.NULL) == lib.QS_ERR_SIZE
    for bad in (0.0, -1.0, np.nan, np.inf):  # frequency factors must be finite and positive
        ff = np.ones(8, np.float32)
        ff[5] = bad
        assert lib.qs_rope(_fp(x), 2, 3, 16, 16, _ip(pos), 1e4, 1.0, 0, _fp(ff)) == lib.QS_ERR_SIZE
    with pytest.raises(ValueError, match="7 frequency factors for 8 pairs"):
        nn.rope(x, pos, freq_factors=np.ones(7, np.float32))
    assert (x == 1).all()
    assert lib.qs_rope(_fp(x), 2, 3, 16, 16, _ip(pos), 1e4, 1.0, 0, ffi.NULL) == lib.QS_OK
    assert not (x == 1).all()
    with pytest.raises(ValueError, match="rot_dim"):
        nn.rope(x, pos, rot_dim=18)


def test_qs_attention_validates_cache_size_positions_and_heads():
    q = np.ones((2, 4, 8), np.float32)
    k = np.ones((3, 2, 8), np.float32)
    out = np.full((2, 4, 8), 7.0, np.float32)
    pos = np.array([0, 1], np.int32)
    kp = ffi.from_buffer(k)

    def call(n_heads=4, hd=8, n_kv_heads=2, n_kv=2, n_ctx=3, window=0, p=pos, n_q=2):
        return lib.qs_attention(_fp(q), n_q, _ip(p), n_heads, hd, kp, kp, 0, n_kv_heads, n_kv, n_ctx, window, 1.0,
                                _fp(out), 1)

    assert call(n_kv=4) == lib.QS_ERR_SIZE  # more valid positions than the cache holds
    assert call(n_kv=-1) == lib.QS_ERR_SIZE
    assert call(n_ctx=-3, n_kv=0) == lib.QS_ERR_SIZE
    assert call(window=-1) == lib.QS_ERR_SIZE
    assert call(n_q=-1) == lib.QS_ERR_SIZE
    assert call(p=np.array([0, -1], np.int32)) == lib.QS_ERR_POS
    assert call(n_heads=0) == lib.QS_ERR_HEADS
    assert call(n_kv_heads=3) == lib.QS_ERR_HEADS
    assert call(n_kv_heads=0) == lib.QS_ERR_HEADS
    assert call(hd=0) == lib.QS_ERR_HEADS
    for cap in (-1.0, np.nan, np.inf):  # gemma2's soft-capping value must be finite and >= 0
        assert lib.qs_attention_softcap(_fp(q), 2, _ip(pos), 4, 8, kp, kp, 0, 2, 2, 3, 0, 1.0, cap, _fp(out),
                                        1) == lib.QS_ERR_SIZE
        with pytest.raises(ValueError, match="softcap"):
            nn.attention(q, pos, k, k, 2, scale=1.0, softcap=cap)
    assert (out == 7).all()
    assert call() == lib.QS_OK and np.allclose(out, 1.0)
    with pytest.raises(KernelError, match="position"):
        nn.attention(q, np.array([0, -1], np.int32), k, k, 2, scale=1.0)
    with pytest.raises(ValueError, match="window"):
        nn.attention(q, pos, k, k, 2, scale=1.0, window=-1)


def test_qs_matmat_refuses_negative_and_overflowing_sizes():
    w = np.zeros(4 * 34, np.uint8)
    x = np.zeros(64, np.float32)
    y = np.full(8, 3.0, np.float32)
    wp = ffi.cast("uint8_t *", ffi.from_buffer(w))
    for t, rows, k, n_x in ((8, 2, -32, 1), (8, -1, 64, 1), (8, 2, 64, -1), (8, 2, 48, 1), (8, 2, 0, 1),
                            (8, 2**62, 64, 1), (8, 2, 2**61, 1), (8, 2, 64, 2**62), (9, 2, 64, 1), (999, 2, 64, 1),
                            (0, 2**61, 2**20, 1)):
        assert lib.qs_matmat(t, wp, rows, k, _fp(x), n_x, _fp(y), 1) == -1, (t, rows, k, n_x)
    assert (y == 3).all()
    assert lib.qs_matvec(8, wp, 2, -32, _fp(x), _fp(y), 1) == -1
    assert lib.qs_dequantize(8, wp, _fp(y), -1, 1) == -1
    assert lib.qs_quantize_activation(0, _fp(x), wp, -4) == -1
    assert (y == 3).all()


@pytest.fixture(scope="module")
def live_block(corpus_dir):
    """A working session on the synthetic gemma3 model (every optional vector present)."""
    model = Model.load(str(valid_model("gemma3", corpus_dir)), threads=1)
    return model, model.session(16, np.float32)


FIELDS = [
    ("n_embd", 0, "QS_ERR_SIZE"), ("n_embd", 65, "QS_ERR_TYPE"), ("n_embd", 96, "QS_ERR_WEIGHT"),
    ("ffn.n_ff", 256, "QS_ERR_WEIGHT"), ("ffn.n_ff", -1, "QS_ERR_SIZE"), ("attn.n_head", 0, "QS_ERR_HEADS"),
    ("attn.n_head", 8, "QS_ERR_WEIGHT"), ("attn.n_head_kv", 3, "QS_ERR_HEADS"), ("attn.n_head_kv", 0, "QS_ERR_HEADS"),
    ("attn.n_head_kv", 2, "QS_ERR_WEIGHT"), ("attn.head_dim", 2048, "QS_ERR_HEADS"),
    ("attn.head_dim", 64, "QS_ERR_WEIGHT"), ("attn.head_dim", -32, "QS_ERR_HEADS"), ("rope.dim", 34, "QS_ERR_HEADS"),
    ("rope.dim", 17, "QS_ERR_HEADS"), ("rope.dim", 0, "QS_ERR_HEADS"), ("attn.n_ctx", 17, "QS_ERR_CACHE"),
    ("attn.n_ctx", 0, "QS_ERR_SIZE"), ("attn.window", -1, "QS_ERR_SIZE"), ("attn.wq.bytes", -1, "QS_ERR_WEIGHT"),
    ("ffn.down.bytes", 0, "QS_ERR_WEIGHT"), ("attn.wo.type", 9, "QS_ERR_TYPE"), ("ffn.gate.type", 999, "QS_ERR_TYPE"),
    ("attn.wq.ptr", None, "QS_ERR_WEIGHT"), ("attn_norm.len", 63, "QS_ERR_VECTOR"),
    ("attn_norm.ptr", None, "QS_ERR_VECTOR"), ("attn.k_norm.ptr", None, "QS_ERR_VECTOR"),
    ("attn.q_norm.len", 64, "QS_ERR_VECTOR"), ("post_ffn_norm.len", 1, "QS_ERR_VECTOR"),
    ("attn.k_cache_bytes", 16 * 32 * 4 - 1, "QS_ERR_CACHE"), ("attn.v_cache", None, "QS_ERR_CACHE"),
    # the description's own shape of a weight must be the one the block reads; the q/k norm span a 0/1 switch
    ("attn.wq.rows", 1, "QS_ERR_WEIGHT"), ("ffn.up.k", 32, "QS_ERR_WEIGHT"), ("ffn.down.rows", 0, "QS_ERR_WEIGHT"),
    ("attn.qk_norm_full", 2, "QS_ERR_SIZE"), ("attn.qk_norm_full", 1, "QS_ERR_VECTOR"),
]


def set_field(b, path: str, value) -> None:
    """Set a (dotted) field of a native ``qs_block``: ``attn.wq.bytes``, ``moe.n_expert`` ..."""
    *parents, name = path.split(".")
    for p in parents:
        b = getattr(b, p)
    setattr(b, name, value)


@pytest.mark.parametrize(("field", "value", "code"), FIELDS, ids=[f"{f}={v}" for f, v, _ in FIELDS])
def test_qs_block_forward_checks_every_size(live_block, field, value, code):
    _model, s = live_block
    good = s._block_structs[0]
    b = ffi.new("qs_block *", good[0])
    set_field(b, field, ffi.NULL if value is None else value)
    x = np.ones((2, 64), np.float32)
    pos = np.array([0, 1], np.int32)
    cache = s.k_cache[0].copy()
    rc = lib.qs_block_forward(b, _fp(x), 2, _ip(pos), 0, 1)
    assert rc == getattr(lib, code), (rc, code)
    assert (x == 1).all() and np.array_equal(s.k_cache[0], cache)  # nothing written


@pytest.mark.parametrize(("T", "n_past", "pos", "code"), [
    (0, 0, [0], "QS_ERR_SIZE"), (-1, 0, [0], "QS_ERR_SIZE"), (2, 15, [15, 16], "QS_ERR_SIZE"),
    (1, -1, [0], "QS_ERR_SIZE"), (2, 0, [0, -1], "QS_ERR_POS"), (2, 0, [0, 16], "QS_ERR_POS"),
    (1, 2**40, [0], "QS_ERR_SIZE"), (2**40, 0, [0], "QS_ERR_SIZE"),
])
def test_qs_block_forward_checks_tokens_and_positions(live_block, T, n_past, pos, code):
    _model, s = live_block
    x = np.ones((2, 64), np.float32)
    p = np.array(pos + [0] * (2 - len(pos)), np.int32)
    rc = lib.qs_block_forward(s._block_structs[0], _fp(x), T, _ip(p), n_past, 1)
    assert rc == getattr(lib, code)
    assert (x == 1).all()
    assert lib.qs_block_forward(ffi.NULL, _fp(x), 1, _ip(p), 0, 1) == lib.QS_ERR_SIZE
    assert lib.qs_block_forward(s._block_structs[0], ffi.NULL, 1, _ip(p), 0, 1) == lib.QS_ERR_SIZE


def test_qs_block_forward_runs_with_the_sizes_it_was_given(live_block):
    _model, s = live_block
    x = np.ones((2, 64), np.float32)
    pos = np.array([0, 1], np.int32)
    assert lib.qs_block_forward(s._block_structs[0], _fp(x), 2, _ip(pos), 0, 1) == lib.QS_OK
    assert np.isfinite(x).all() and not (x == 1).all()


# ------------------------------------------------------------------------------------------ bump + config.json
@pytest.fixture(scope="module")
def bump_pair(corpus_dir) -> tuple[Path, dict[str, Any]]:
    """The synthetic llama converted to a bump file (F32 down projections: the bump profiles take no F16)."""
    tens = {f"blk.{i}.ffn_down.weight": base_tensors("llama")[f"blk.{i}.ffn_down.weight"].astype(np.float32)
            for i in range(SPECS["llama"]["L"])}
    src = write_model(corpus_dir / "for-bump.gguf", "llama", tensors=tens)
    out = corpus_dir / "bump"
    out.mkdir()
    res = cli("convert", str(src), "-o", str(out / "w.bump"), "--config", str(out / "config.json"))
    assert res.returncode == 0, res.stderr
    return out / "w.bump", json.loads((out / "config.json").read_text())


def test_valid_bump_runs_like_its_gguf(bump_pair, corpus_dir):
    bump, cfg = bump_pair
    cfg_path = corpus_dir / "config-ok.json"
    cfg_path.write_text(json.dumps(cfg))
    a = Model.load_bump(str(bump), str(cfg_path), threads=1).session(16).forward([1, 2, 3])
    b = Model.load(str(corpus_dir / "for-bump.gguf"), threads=1).session(16).forward([1, 2, 3])
    assert np.allclose(a, b, rtol=1e-5, atol=1e-5)


BUMP_CASES = [
    ({"hidden_size": 96}, ModelError, ("config.json hidden_size", "expected 64", "found 96")),
    ({"num_key_value_heads": "2"}, ModelError, ("config.json num_key_value_heads", "expected an integer")),
    ({"num_key_value_heads": 4}, ModelError, ("config.json num_key_value_heads", "expected 2", "found 4")),
    ({"num_attention_heads": 0}, ModelError, ("config.json num_attention_heads", "found 0")),
    ({"intermediate_size": 256}, ModelError, ("config.json intermediate_size", "expected 128", "found 256")),
    ({"intermediate_size": -128}, ModelError, ("config.json intermediate_size", "found -128")),
    ({"num_hidden_layers": 3}, ModelError, ("config.json num_hidden_layers", "expected 2", "found 3")),
    ({"vocab_size": 300}, ModelError, ("config.json vocab_size", f"expected {N_VOCAB}", "found 300")),
    ({"max_position_embeddings": True}, ModelError, ("config.json max_position_embeddings", "expected an integer")),
    ({"rms_norm_eps": float("nan")}, ModelError, ("config.json rms_norm_eps", "finite", "nan")),
    ({"rms_norm_eps": [1e-5]}, ModelError, ("config.json rms_norm_eps", "finite")),
    ({"rope_theta": -1.0}, ModelError, ("config.json rope_theta", "found -1.0")),
    ({"rope_theta": float("inf")}, ModelError, ("config.json rope_theta", "inf")),
    ({"model_type": "gemma3"}, UnsupportedModel, ("config.json says 'gemma3'",)),
    ({"model_type": ["llama"]}, UnsupportedModel, ("config.json says ['llama']",)),
]


@pytest.mark.parametrize(("change", "exc", "expect"), BUMP_CASES, ids=[str(c[0])[:40] for c in BUMP_CASES])
def test_bad_bump_config_is_refused_naming_the_key(bump_pair, change, exc, expect, tmp_path):
    bump, cfg = bump_pair
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps({**cfg, **change}))
    with pytest.raises(UnsupportedModel) as ei:
        Model.load_bump(str(bump), str(cfg_path), threads=1)
    assert type(ei.value) is exc, repr(ei.value)
    for part in expect:
        assert part in str(ei.value), (part, str(ei.value))


def test_bump_config_that_is_not_an_object_is_refused(bump_pair, tmp_path):
    bump, _cfg = bump_pair
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text("[1, 2]")
    with pytest.raises(ModelError, match="expected a JSON object, found list"):
        Model.load_bump(str(bump), str(cfg_path), threads=1)


# ------------------------------------------------------------------------------------------ a real model, edited
@pytest.mark.parametrize(("key", "value", "expect"), [
    ("llama.embedding_length", 640, "expected 576"),
    ("llama.feed_forward_length", 2048, "blk.0.ffn_gate.weight"),
    ("llama.attention.head_count", 8, "divisor"),
    ("llama.rope.dimension_count", 640, "at most the head dimension 64"),
])
def test_real_model_with_one_edited_hyperparameter_is_refused(model_path, key, value, expect, tmp_path):
    """The issue's reproduction: one UINT32 of SmolLM2 rewritten in place; generate must refuse, not crash."""
    import shutil

    from quantscope.core.gguf import GGUFFile

    path = tmp_path / "edited.gguf"
    shutil.copyfile(model_path("smollm2"), path)
    with GGUFFile(path) as f:
        kv = f.metadata[key]
        assert kv.type_label == "UINT32"
        offset = kv.value_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(int(value).to_bytes(4, "little"))
    res = cli("generate", str(path), "-p", "hi", "-n", "2", "--backend", "cpu")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscope: error:") and key in lines[0] and expect in lines[0]
