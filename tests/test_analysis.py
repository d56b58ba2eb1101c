"""core.analysis: statistics, histograms, heatmaps, memory, integrity, scale scan, block geometry, search."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from quantscope.core import analysis as A
from quantscope.core import jobs
from quantscope.core.bump import CancelToken
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf import checks as chk
from quantscope.core.model import memory as mem
from quantscope.core.quant import decode_block
from quantscope.core.quant import scales as scl


def _all_values(f: GGUFFile, name: str) -> np.ndarray:
    t = f.tensor(name)
    return A.dequantize_rows(f, t, 0, t.n_rows)


def test_stats_histogram_heatmap_match_numpy(model_path):
    with GGUFFile(model_path("smollm2")) as f:
        name = "blk.0.ffn_down.weight"
        t = f.tensor(name)
        seen = []
        a = A.analyze_tensor(f, name, bins=64, heat_size=(100, 50), chunk_elems=1 << 16,
                             progress=lambda d, n: seen.append((d, n)))
        x = _all_values(f, name).astype(np.float64)
        s = a.stats
        assert s.n_elements == x.size == t.n_elements and s.n_nan == s.n_inf == 0
        assert s.min == x.min() and s.max == x.max()
        assert s.mean == pytest.approx(x.mean(), rel=1e-9, abs=1e-12)
        assert s.std == pytest.approx(x.std(), rel=1e-5)
        assert s.n_zero == int((x == 0).sum())
        assert np.array_equal(a.histogram.counts, np.histogram(x, a.histogram.edges)[0])
        assert a.histogram.counts.sum() == x.size
        hm = a.heatmap
        assert hm.shape == (-(-t.n_rows // hm.row_step), -(-t.row_len // hm.col_step))
        assert hm.shape[0] <= 100 and hm.shape[1] <= 50
        m = x.reshape(t.n_rows, t.row_len)
        for row, col in ((0, 0), (t.n_rows - 1, t.row_len - 1), (333, 77)):
            c = hm.cell_at(row, col)
            block = m[c.row0:c.row1, c.col0:c.col1]
            assert c.row0 <= row < c.row1 and c.col0 <= col < c.col1
            assert c.mean == pytest.approx(block.mean(), rel=1e-5, abs=1e-9)
            assert c.rms == pytest.approx(np.sqrt((block**2).mean()), rel=1e-5)
        assert hm.cell_at(t.n_rows, 0) is None
        dones = [d for d, _ in seen]
        assert dones == sorted(dones) and seen[-1] == (2 * t.n_elements, 2 * t.n_elements)


def test_heatmap_region_is_exact_when_small(model_path):
    with GGUFFile(model_path("gemma3")) as f:
        t = f.tensor("blk.3.ffn_down.weight")
        hm = A.heatmap(f, t, rows=(7, 17), cols=(512, 600))
        assert hm.exact and hm.shape == (10, 88) and (hm.row0, hm.col0) == (7, 512)
        x = A.dequantize_rows(f, t, 7, 17)[:, 512:600]
        assert np.array_equal(hm.mean, x)
        lo, hi = hm.levels("mean")
        assert lo == -hi and hi > 0
        with pytest.raises(ValueError):
            A.heatmap(f, t, rows=(5, 5))


def test_cancel_stops_analysis(model_path):
    with GGUFFile(model_path("qwen2.5-coder")) as f:
        token = CancelToken()
        calls = []

        def progress(done, total):
            calls.append(done)
            token.cancel()

        with pytest.raises(A.AnalysisCancelled):
            A.analyze_tensor(f, "output.weight", progress=progress, cancel=token)
        assert len(calls) == 1


def test_memory_plan_from_the_file(model_path):
    with GGUFFile(model_path("qwen2.5-coder")) as f:
        m = mem.memory_plan(f, 4096)
        # 24 layers, 2 KV heads, head dim 64 for K and V, F16
        assert m.kv_bytes_per_token == 24 * 2 * (64 + 64) * 2
        assert m.kv_bytes == 4096 * m.kv_bytes_per_token
        assert m.weights_bytes == sum(t.n_bytes for t in f.tensors)
        assert m.total_bytes == m.weights_bytes + m.kv_bytes and m.note == ""
        q8 = mem.memory_plan(f, 4096, "Q8_0")
        assert q8.kv_bytes_per_token == 24 * 2 * 2 * 68  # 64 elements = 2 Q8_0 blocks of 34 bytes
        assert mem.memory_plan(f).context == 32768
    with GGUFFile(model_path("gemma3")) as f:
        m = mem.memory_plan(f, 1000)
        assert (m.key_length, m.value_length, m.n_kv_heads, m.n_layers) == (256, 256, 1, 18)
        assert "sliding-window" in m.note


def _tiny_gguf(path, *, nan_block: int | None = None, with_iq2: bool = False):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("tokenizer.ggml.tokens", ["<s>", "Hello", "hello", "hel", "lo", "HELLO world"],
                    gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    rng = np.random.default_rng(3)
    q = rng.integers(0, 256, size=(4, 18 * 2), dtype=np.uint8)  # 4 rows of 64 Q4_0 elements
    for b in range(8):
        r, k = divmod(b, 2)
        q[r, 18 * k:18 * k + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if nan_block is not None:
        r, k = divmod(nan_block, 2)
        q[r, 18 * k:18 * k + 2] = np.frombuffer(np.uint16(0x7E00).tobytes(), np.uint8)
    w.add_tensor("q4", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("token_embd.weight", rng.standard_normal((7, 8)).astype(np.float32))  # 7 rows, 6 tokens
    if with_iq2:  # a type without a decoder here (ggml's newer Q1_0)
        w.add_tensor("iq2", rng.integers(0, 256, size=(1, 18), dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q1_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_scan_scales_finds_planted_nan(tmp_path):
    with GGUFFile(_tiny_gguf(tmp_path / "nan.gguf", nan_block=5, with_iq2=True)) as f:
        r = scl.scan_scales(f)
        assert r.n_bad == 1 and r.bad == [scl.BadScale("q4", 5, "d", 0x7E00)]
        assert r.tensors_scanned == 2 and any("iq2" in s for s in r.skipped)
        assert A.analyze_tensor(f, "q4").stats.n_nan == 32  # the whole block dequantizes to NaN
    with GGUFFile(_tiny_gguf(tmp_path / "ok.gguf")) as f:
        assert scl.scan_scales(f).n_bad == 0


def test_scan_scales_on_real_models(model_path):
    with GGUFFile(model_path("gemma3")) as f:
        r = scl.scan_scales(f)
        assert r.n_bad == 0 and r.tensors_scanned == len(f.tensors) and not r.skipped
        q4k = sum(t.n_bytes // 144 for t in f.tensors if t.type_name == "Q4_K")
        assert r.blocks_scanned > q4k


def test_integrity_checks(tmp_path, model_path):
    with GGUFFile(model_path("qwen2.5-coder")) as f:
        checks = {c.name: c for c in chk.integrity_checks(f)}
        assert all(c.ok is not False for c in checks.values())
        assert checks["vocabulary matches embedding"].detail == "151,936 tokens, token_embd has 151,936 rows"
    path = _tiny_gguf(tmp_path / "t.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # cut into the last tensor
    with GGUFFile(path, strict=False) as f:
        checks = {c.name: c for c in chk.integrity_checks(f)}
        assert checks["tensors inside the file"].ok is False
        assert "token_embd.weight" in checks["tensors inside the file"].detail
        assert checks["vocabulary matches embedding"].ok is False  # 6 tokens vs 7 rows
    with GGUFFile(_tiny_gguf(tmp_path / "u.gguf", with_iq2=True)) as f:
        assert A.can_read_values(f.tensor("q4")) and A.can_read_values(f.tensor("iq2")) is False


def test_block_geometry_q4k(model_path):
    with GGUFFile(model_path("gemma3")) as f:
        t = f.tensor("blk.3.ffn_down.weight")
        b = decode_block(t.type, f.block_bytes(t, 7, 2))
    assert scl.scale_fields("Q4_K") == (("d", 0), ("dmin", 2))
    assert scl.scale_fields("Q6_K") == (("d", 208),) and scl.scale_fields("F32") == ()
    owners = A.scale_bit_owners(b)
    assert len(owners) == 96  # 8 scales + 8 mins × 6 bits = every bit of the 12 scale bytes
    assert {k[0] for k in owners} == set(range(4, 16))
    assert owners[(12, 0)] == A.BitOwner("sc", 4, 0) and owners[(4, 7)] == A.BitOwner("sc", 4, 5)
    assert owners[(12, 7)] == A.BitOwner("m", 4, 3) and owners[(8, 6)] == A.BitOwner("m", 4, 4)
    for (byte, bit), o in owners.items():  # the owners reassemble the unpacked values
        assert ((b.raw[byte] >> bit) & 1) == ((b.scales[o.name][o.index] >> o.value_bit) & 1)
    lay = A.code_layout(b)
    assert lay.slot_bits == 4 and lay.slots_per_byte == 2 and lay.bytes == tuple(range(16, 144))
    assert lay.element_at[(21, 4)] == 37 and lay.element_at[(16, 0)] == 0 and lay.element_at[(48, 0)] == 64
    assert A.field_at(b, 37) == "qs" and A.field_at(b, 5) == "scales"
    assert A.element_location(t, 7, 2 * 256 + 37) == (2, 37)
    with pytest.raises(IndexError):
        A.element_location(t, t.n_rows, 0)


@pytest.mark.parametrize("type_name, slot_bits", [("Q8_0", 8), ("Q2_K", 2), ("Q3_K", 2), ("Q6_K", 4), ("Q5_0", 4)])
def test_code_layout_slot_widths(type_name, slot_bits):
    from quantscope.core.quant import ggml_type

    t = ggml_type(type_name)
    b = decode_block(t, bytes(range(t.block_bytes % 256)) + bytes(t.block_bytes - t.block_bytes % 256))
    lay = A.code_layout(b)
    assert lay.slot_bits == slot_bits
    assert sorted(lay.element_at.values()) == list(range(t.block_elems))


def test_fp16_parts():
    one = A.fp16_parts(0x3C00)
    assert (one.sign, one.exponent, one.mantissa, one.value, one.kind) == (0, 15, 0, 1.0, "normal")
    assert A.fp16_parts(0xC000).value == -2.0 and A.fp16_parts(0xC000).sign == 1
    assert A.fp16_parts(0x7C00).kind == "Inf" and A.fp16_parts(0x7E00).kind == "NaN"
    assert A.fp16_parts(0x0001).kind == "subnormal"


def test_find_in_strings(tmp_path, model_path):
    with GGUFFile(_tiny_gguf(tmp_path / "s.gguf")) as f:
        toks = f.get("tokenizer.ggml.tokens")
        fast = A.find_in_strings(toks, "hello", path=str(f.path))
        assert fast.tolist() == [1, 2, 5]
        assert A.find_in_strings(toks, "hello").tolist() == [1, 2, 5]
        assert A.find_in_strings(toks, "hello", ignore_case=False, path=str(f.path)).tolist() == [2]
        assert A.find_in_strings(toks, "lo", path=str(f.path)).tolist() == [1, 2, 4, 5]
        assert A.find_in_strings(toks, "lh", path=str(f.path)).size == 0  # never across two strings
        assert A.find_in_strings(toks, "", limit=3).tolist() == [0, 1, 2]
    with GGUFFile(model_path("gemma3")) as f:
        toks = f.get("tokenizer.ggml.tokens")
        hits = A.find_in_strings(toks, "hello", path=str(f.path))
        assert hits.size >= 8 and all("hello" in toks[int(i)].lower() for i in hits)


def test_rate_meter_and_durations():
    now = [0.0]
    m = jobs.RateMeter(window=2.0, clock=lambda: now[0])
    now[0] = 1.0
    rate, eta = m.update(100, 1000)
    assert rate == pytest.approx(100.0) and eta == pytest.approx(9.0)
    now[0] = 2.0
    rate, eta = m.update(300, 1000)
    assert rate == pytest.approx(200.0) and eta == pytest.approx(3.5)
    assert jobs.format_duration(75.2) == "1:15" and jobs.format_duration(3725) == "1:02:05"
    assert jobs.format_duration(None) == "…"


def test_weights_by_layer_and_groups(model_path):
    with GGUFFile(model_path("smollm2")) as f:
        rows = mem.weights_by_layer(f)
        assert rows[0][0] == "" and [g for g, _ in rows[1:]] == [f"blk.{i}" for i in range(30)]
        assert sum(b for _, b in rows) == sum(t.n_bytes for t in f.tensors)
    assert mem.block_group("blk.12.attn_q.weight") == "blk.12" and mem.block_group("output.weight") == ""
