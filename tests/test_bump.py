"""GGUF -> BUMPWGT3: byte-exact against an independent construction from the spec, both profiles, refusals,
atomic output (cancel, kill, disk full), the reader/inspector and the verifier."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.cli.main import main as cli_main
from quantscope.core.bump import (
    BumpError,
    BumpRefusal,
    BumpWriteError,
    Cancelled,
    CancelToken,
    ConvertJob,
    describe,
    open_bump,
    verify_against,
)

Q = gguf.GGMLQuantizationType
E, H, KV, FF, L, V, C = 256, 4, 2, 512, 2, 300, 64
HD = E // H
CKERNEL = {"F32": 0, "BF16": 1, "F16": 2, "Q4_0": 5, "Q4_1": 6, "Q4_K": 7, "Q6_K": 8, "Q8_0": 9, "Q5_0": 11, "Q5_1": 12}
SEED = {"F32": 0, "BF16": 1, "F16": 2, "Q4_K": 6, "Q6_K": 7}
FP16_AT = {"Q4_K": [0, 2], "Q6_K": [208], "Q8_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2]}


def quant_rows(rng, qtype: str, rows: int, k: int) -> np.ndarray:
    """Valid random blocks: random code bytes, small finite fp16 scales."""
    bs, tsz = gguf.GGML_QUANT_SIZES[Q[qtype]]
    raw = rng.integers(0, 256, size=(rows, k // bs, tsz), dtype=np.uint8)
    for off in FP16_AT[qtype]:
        s = (rng.random((rows, k // bs)) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = s.view(np.uint8).reshape(rows, k // bs, 2)
    return raw.reshape(rows, -1)


def write_model(path: Path, arch: str = "llama", *, types: dict[str, str] | None = None, biases: bool = False,
                output: str | None = None, extra: dict[str, np.ndarray] | None = None, skip: tuple[str, ...] = (),
                shapes: dict[str, tuple[int, int]] | None = None, seed: int = 0) -> Path:
    """A small llama/qwen2 GGUF. ``types`` overrides weight types per short name (embd, q, k, v, o, gate, up,
    down); ``output`` adds output.weight: 'copy' (requantized token_embd) or 'different'."""
    rng = np.random.default_rng(seed)
    t = {"embd": "Q4_K", "q": "Q4_K", "k": "Q4_K", "v": "Q6_K", "o": "Q4_K", "gate": "Q4_K", "up": "Q4_K",
         "down": "Q6_K", **(types or {})}
    sh = {"q": (E, H * HD), "k": (E, KV * HD), "v": (E, KV * HD), "o": (H * HD, E), "gate": (E, FF), "up": (E, FF),
          "down": (FF, E), "embd": (E, V), **(shapes or {})}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.embedding_length", E)
    w.add_uint32(f"{arch}.block_count", L)
    w.add_uint32(f"{arch}.feed_forward_length", FF)
    w.add_uint32(f"{arch}.attention.head_count", H)
    w.add_uint32(f"{arch}.attention.head_count_kv", KV)
    w.add_uint32(f"{arch}.context_length", C)
    w.add_float32(f"{arch}.rope.freq_base", 1000000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)

    def weight(name: str, short: str) -> None:
        if name in skip:
            return
        k, rows = sh[short]
        qt = t[short]
        if qt == "F32":
            w.add_tensor(name, rng.standard_normal((rows, k)).astype(np.float32))
        else:
            w.add_tensor(name, quant_rows(rng, qt, rows, k), raw_dtype=Q[qt])

    def vec(name: str, n: int, dtype=np.float32) -> None:
        if name not in skip:
            w.add_tensor(name, (rng.standard_normal(n) * 3).astype(dtype))

    weight("token_embd.weight", "embd")
    for i in range(L):
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", E)
        vec(b + "ffn_norm.weight", E, np.float16)
        weight(b + "attn_q.weight", "q")
        weight(b + "attn_k.weight", "k")
        weight(b + "attn_v.weight", "v")
        weight(b + "attn_output.weight", "o")
        weight(b + "ffn_gate.weight", "gate")
        weight(b + "ffn_up.weight", "up")
        weight(b + "ffn_down.weight", "down")
        if biases:
            vec(b + "attn_q.bias", H * HD)
            vec(b + "attn_k.bias", KV * HD, np.float16)
            vec(b + "attn_v.bias", KV * HD)
    vec("output_norm.weight", E)
    if output == "copy":
        rows = gguf.quants.dequantize(quant_rows(np.random.default_rng(seed), t["embd"], V, E), Q[t["embd"]])
        rows = rows + rng.standard_normal(rows.shape).astype(np.float32) * 1e-4
        w.add_tensor("output.weight", gguf.quants.quantize(rows.astype(np.float32), Q.Q8_0), raw_dtype=Q.Q8_0)
    elif output == "different":
        w.add_tensor("output.weight", quant_rows(rng, "Q8_0", V, E), raw_dtype=Q.Q8_0)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def expected_bump(gguf_path: Path, codes: dict[str, int], context: int = C) -> bytes:
    """Build the bump bytes straight from bump.md with gguf-py's reader: an independent implementation."""
    r = gguf.GGUFReader(gguf_path)
    T = {t.name: t for t in r.tensors}

    def raw(name: str) -> bytes:
        return np.asarray(T[name].data).reshape(-1).view(np.uint8).tobytes()

    def tname(name: str) -> str:
        return T[name].tensor_type.name

    def f32(name: str | None, n: int) -> bytes:
        if name is None or name not in T:
            return bytes(4 * n)
        v = np.asarray(T[name].data).reshape(-1).astype(np.float32)
        out = np.zeros(n, np.float32)
        out[: min(n, v.size)] = v[:n]
        return out.tobytes()

    sections: list[tuple[int, bytes]] = [(codes[tname("token_embd.weight")], raw("token_embd.weight")),
                                         (0, bytes(4 * context * E))]
    for i in range(L):
        b = f"blk.{i}."
        sections += [
            (0, f32(b + "attn_norm.weight", E)), (0, f32(b + "ffn_norm.weight", E)),
            (codes[tname(b + "attn_q.weight")], raw(b + "attn_q.weight")), (0, f32(b + "attn_q.bias", H * HD)),
            (codes[tname(b + "attn_k.weight")], raw(b + "attn_k.weight")), (0, f32(b + "attn_k.bias", KV * HD)),
            (codes[tname(b + "attn_v.weight")], raw(b + "attn_v.weight")), (0, f32(b + "attn_v.bias", KV * HD)),
            (codes[tname(b + "attn_output.weight")], raw(b + "attn_output.weight")), (0, bytes(4 * E)),
            (codes[tname(b + "ffn_gate.weight")], raw(b + "ffn_gate.weight") + raw(b + "ffn_up.weight")),
            (0, bytes(4 * 2 * FF)),
            (codes[tname(b + "ffn_down.weight")], raw(b + "ffn_down.weight")), (0, bytes(4 * E)),
        ]
    sections += [(0, f32("output_norm.weight", E)), (0, bytes(4 * E))]
    body = struct.pack("<I", len(sections)) + bytes(c for c, _ in sections) + b"".join(d for _, d in sections)
    digest = hashlib.sha256(body).digest()
    header = struct.pack("<8sIIIIIIIIQQQ32s32s", b"BUMPWGT3", 3, 1, L, V, E, context, H, HD, E, HD,
                         (context + 15) // 16 * 16, digest, bytes(32))
    return header + body


@pytest.mark.parametrize("profile, codes", [("ckernel", CKERNEL), ("seed", SEED)])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_synthetic_models_convert_byte_exact(tmp_path, arch, profile, codes):
    src = write_model(tmp_path / "m.gguf", arch, biases=arch == "qwen2")
    out = tmp_path / "out" / "w.bump"
    out.parent.mkdir()  # writers do not create folders
    res = ConvertJob(src, out, profile=profile).run()
    want = expected_bump(src, codes)
    got = out.read_bytes()
    assert len(got) == len(want) == res.size
    assert got == want
    assert res.sha256 == hashlib.sha256(want[128:]).hexdigest()
    assert res.plan.lm_head.decision == "tied"
    assert bool(res.plan.biases) == (arch == "qwen2")
    b = open_bump(out)  # no manifest: the profile is inferred from the sizes
    assert (b.profile, b.profile_source, b.kv_heads, b.ffn) == (profile, "inferred", KV, FF)
    assert verify_against(out, src).ok


def test_ckernel_only_types_and_context_override(tmp_path):
    src = write_model(tmp_path / "m.gguf", types={"embd": "Q8_0", "q": "Q5_0", "k": "Q5_1", "gate": "Q8_0",
                                                    "up": "Q8_0", "down": "Q4_K"})
    out = tmp_path / "w.bump"
    ConvertJob(src, out, context=40).run()
    assert out.read_bytes() == expected_bump(src, CKERNEL, context=40)
    with pytest.raises(BumpRefusal, match=r"token_embd.weight is Q8_0: the seed profile has no dtype code"):
        ConvertJob(src, tmp_path / "s.bump", profile="seed").run()
    assert not (tmp_path / "s.bump").exists()


def test_config_and_manifest(tmp_path):
    src = write_model(tmp_path / "m.gguf", "qwen2", biases=True)
    out, cfg, man = tmp_path / "o" / "w.bump", tmp_path / "o" / "config.json", tmp_path / "o" / "manifest.json"
    out.parent.mkdir()  # writers do not create folders
    ConvertJob(src, out, config_path=cfg, manifest_path=man).run()
    text = cfg.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "architectures": [\n    "LlamaForCausalLM"\n  ],')
    c = json.loads(text)
    assert list(c) == ["architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
                       "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
                       "rms_norm_eps", "rope_theta"]
    assert c["model_type"] == "qwen2" and c["num_key_value_heads"] == KV and c["max_position_embeddings"] == C
    assert c["rms_norm_eps"] == 9.999999974752427e-07 and c["rope_theta"] == 1000000.0
    m = json.loads(man.read_text())
    assert m["profile"] == "ckernel" and m["has_attention_biases"] is True
    assert len(m["entries"]) == 14 * L + 4 and m["entries"][0]["name"] == "token_emb"
    assert m["entries"][-1]["file_offset"] + m["entries"][-1]["size"] == out.stat().st_size
    b = open_bump(out)
    assert b.profile_source == "manifest"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"types": {"q": "Q4_1"}}, r"attn_q.weight is Q4_1.*ckernel"),
        ({"types": {"up": "Q6_K"}}, r"ffn_gate.weight \(Q4_K\) and blk.0.ffn_up.weight \(Q6_K\) differ"),
        ({"skip": ("blk.1.attn_v.weight",)}, r"Missing tensor blk.1.attn_v.weight"),
        ({"shapes": {"k": (E, 3 * HD)}}, r"attn_k.weight has shape \[256, 192\] but BUMPWGT3 expects \[256, 128\]"),
        ({"extra": {"blk.0.post_ffw_norm.weight": np.ones(E, np.float32)}}, r"no slot in BUMPWGT3: blk.0.post_ffw"),
        ({"output": "different"}, r"genuinely different lm_head.*--drop-untied-head"),
    ],
)
def test_refusals_name_the_tensor(tmp_path, kwargs, message):
    src = write_model(tmp_path / "m.gguf", **kwargs)
    with pytest.raises(BumpRefusal, match=message):
        ConvertJob(src, tmp_path / "w.bump").run()
    assert os.listdir(tmp_path) == ["m.gguf"]


def test_untied_head_copy_vs_different(tmp_path):
    copy = write_model(tmp_path / "c.gguf", output="copy")
    res = ConvertJob(copy, tmp_path / "c.bump").run()
    assert res.plan.lm_head.decision == "copy" and res.plan.lm_head.relative_rmse < 0.05
    diff = write_model(tmp_path / "d.gguf", output="different")
    res = ConvertJob(diff, tmp_path / "d.bump", drop_untied_head=True).run()
    assert res.plan.lm_head.decision == "dropped" and res.plan.lm_head.relative_rmse > 0.5


def test_real_refusals(model_path, tmp_path):
    with pytest.raises(BumpRefusal, match=r"gemma3 has tensors with no slot.*post_attention_norm"):
        ConvertJob(model_path("gemma3"), tmp_path / "g.bump").run()
    with pytest.raises(BumpRefusal, match=r"Q4_1"):
        ConvertJob(model_path("smollm2"), tmp_path / "s.bump").run()
    assert list(tmp_path.iterdir()) == []


def test_real_qwen_converts_and_verifies(model_path, tmp_path):
    src = model_path("qwen2.5-coder")
    out = tmp_path / "w.bump"
    res = ConvertJob(src, out, context=2048).run()
    assert res.plan.lm_head.decision == "copy"
    assert len(res.plan.biases) == 72
    assert out.stat().st_size == 349_259_224 == res.size
    rep = verify_against(out, src)
    assert rep.ok and rep.sections_checked == 14 * 24 + 4
    b = open_bump(out)
    assert (b.profile, b.kv_heads, b.ffn, b.header.context_len, b.header.aligned_context) == ("ckernel", 2, 4864,
                                                                                              2048, 2048)
    d = describe(b, True)
    assert d["dtype_table"] == {"0": "F32", "7": "Q4_K", "8": "Q6_K", "9": "Q8_0", "11": "Q5_0"}
    # one flipped byte in a weight: checksum and section comparison both catch it
    with open(out, "r+b") as fh:
        fh.seek(b.section("layer.5.w2").offset + 1000)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x40]))
    rep = verify_against(out, src)
    assert not rep.ok and not rep.checksum_ok
    assert any(p.startswith("layer.5.w2: bytes differ") for p in rep.problems)


def test_cancel_leaves_nothing(tmp_path):
    src = write_model(tmp_path / "m.gguf")
    token = CancelToken()
    seen = []

    def progress(p):
        seen.append(p.phase)
        if p.phase == "writing":
            token.cancel()

    with pytest.raises(Cancelled):
        ConvertJob(src, tmp_path / "w.bump", chunk_bytes=4096).run(progress, token)
    assert "writing" in seen
    assert os.listdir(tmp_path) == ["m.gguf"]


def test_disk_full_is_a_clear_error(tmp_path, monkeypatch):
    src = write_model(tmp_path / "m.gguf", types={"embd": "F32"})
    real_write = os.write
    calls = {"n": 0}

    def full(fd, data):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    def no_cfr(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    monkeypatch.setattr(os, "copy_file_range", no_cfr)
    with pytest.raises(BumpWriteError, match="No space left on the device"):
        ConvertJob(src, tmp_path / "w.bump").run()
    assert os.listdir(tmp_path) == ["m.gguf"]


def test_killed_conversion_leaves_no_target(model_path, tmp_path):
    src = model_path("qwen2.5-coder")
    out = tmp_path / "w.bump"
    proc = subprocess.Popen([sys.executable, "-m", "quantscope.cli", "convert", str(src), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # the writer is running once progress is reported (the temporary is unnamed)
        if line.startswith("convert:"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(120)
    assert not out.exists()
    assert os.listdir(tmp_path) == []  # O_TMPFILE: nothing named was ever created


def test_reader_rejects_damaged_files(tmp_path):
    src = write_model(tmp_path / "m.gguf")
    out = tmp_path / "w.bump"
    ConvertJob(src, out).run()
    data = out.read_bytes()
    cases = {
        "short.bump": (data[:100], "shorter than the 128-byte"),
        "magic.bump": (b"BUMPWGT2" + data[8:], "bad magic"),
        "count.bump": (data[:128] + struct.pack("<I", 7) + data[132:], "section count 7 at byte 128"),
        "trunc.bump": (data[:-10], "truncated or corrupted"),
        "codes.bump": (data[:133] + bytes([99]) + data[134:], "no dtype table contains every code"),
        "ctx.bump": (data[:0x38] + struct.pack("<Q", 65) + data[0x40:], "aligned_context"),
    }
    for name, (blob, msg) in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(BumpError, match=msg):
            open_bump(tmp_path / name)


def test_cli_convert_inspect_verify(tmp_path, capsys):
    src = write_model(tmp_path / "m.gguf", "qwen2", biases=True, types={"embd": "Q8_0"})
    out = tmp_path / "w.bump"
    assert cli_main(["convert", str(src), "-o", str(out), "--config", str(tmp_path / "config.json")]) == 0
    text = capsys.readouterr().out
    assert "profile   ckernel" in text and "6 real q/k/v bias tensors carried" in text and "sha256" in text
    assert "lm_head   tied" in text
    assert cli_main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Profile     ckernel (inferred)" in text and "verifies" in text and "layer.1.w2" in text
    assert cli_main(["verify", str(out), "--against", str(src)]) == 0
    assert "verified" in capsys.readouterr().out
    assert cli_main(["convert", str(src), "-o", str(tmp_path / "s.bump"), "--profile", "seed"]) == 2
    err = capsys.readouterr().err
    assert "cannot convert m.gguf" in err and "Traceback" not in err


@pytest.mark.parametrize("keep", [0.5, 0.05])
def test_source_truncated_mid_conversion_is_a_clear_error(tmp_path, keep):
    """The GGUF shrinks under the writer (its mapping loses pages): a BumpWriteError naming the change, no
    SIGBUS, nothing left at the target path."""
    src = write_model(tmp_path / "m.gguf")
    size = src.stat().st_size

    def progress(p):
        if p.phase == "writing" and src.stat().st_size == size:
            os.truncate(src, int(size * keep))

    with pytest.raises(BumpWriteError, match="source file changed while it was being converted"):
        ConvertJob(src, tmp_path / "w.bump", chunk_bytes=4096).run(progress, CancelToken())
    assert os.listdir(tmp_path) == ["m.gguf"]
