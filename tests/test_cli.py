"""The command line: inspect, dump-block, models, bench; errors as one message, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quantscope.cli.main import main
from quantscope.core import catalog

from .test_reader_synthetic import write_all_types


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_text_real_model(capsys, model_path):
    rc, out, _ = run(capsys, "inspect", str(model_path("qwen2.5-coder")))
    assert rc == 0
    assert "version 3, alignment 32, data offset 5,947,776" in out
    assert "MOSTLY_Q4_K_M (15)" in out
    assert "[STRING × 151936] '!', '\"', '#', '$', …" in out
    assert "embedding_length" in out and "896" in out
    assert "blk.0.ffn_down.weight      Q6_K" in out
    assert "By type" in out and "Q5_0" in out


def test_inspect_json(capsys, model_path):
    rc, out, _ = run(capsys, "inspect", "--json", str(model_path("gemma3")))
    assert rc == 0
    s = json.loads(out)
    assert s["file_type"] == {"value": 15, "name": "MOSTLY_Q4_K_M"}
    assert s["tensor_count"] == 236 and len(s["tensors"]) == 236
    toks = next(m for m in s["metadata"] if m["key"] == "tokenizer.ggml.tokens")
    assert toks["type"] == "ARRAY[STRING]" and toks["value"]["count"] == 262144
    assert {r["type"] for r in s["types"]} == {"Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"}
    assert abs(sum(r["share"] for r in s["types"]) - s["tensor_bytes"] / s["file_size"]) < 1e-9
    assert s["hyperparameters"]["attention.sliding_window"] == 512


def test_dump_block_q4k(capsys, model_path):
    rc, out, _ = run(capsys, "dump-block", str(model_path("gemma3")), "blk.3.ffn_down.weight",
                     "--row", "7", "--block", "2", "--element", "37")
    assert rc == 0
    assert "type Q4_K" in out and "at file offset 197,430,624" in out
    assert "dmin" in out and "0x1112 = 0.00061893463" in out
    assert "sc[4] =  63  <- byte 12[3:0] -> bits 3:0, byte 4[7:6] -> bits 5:4" in out
    assert "x[37] = d · sc[1] · q − dmin · m[1]" in out


def test_dump_block_json(capsys, model_path):
    rc, out, _ = run(capsys, "dump-block", "--json", str(model_path("smollm2")), "blk.0.ffn_up.weight")
    assert rc == 0
    d = json.loads(out)
    assert d["type"] == "Q4_1" and len(d["values"]) == 32 and len(d["raw_hex"]) == 40
    assert [f["name"] for f in d["fields"]] == ["d", "m", "qs"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["dump-block", "{gemma}", "blk.3.ffn_down.weight", "--row", "640"], "row 640 out of range"),
        (["dump-block", "{gemma}", "blk.3.ffn_down.weight", "--block", "8"], "block 8 out of range"),
        (["dump-block", "{gemma}", "blk.3.ffn_dow"], "no tensor named 'blk.3.ffn_dow'"),
        (["inspect", "/nonexistent.gguf"], "no such file"),
        (["inspect", "{corrupt}"], "not a readable GGUF file: at byte 0"),
        (["models", "path", "nope"], "unknown model 'nope'"),
    ],
)
def test_errors_are_one_line(capsys, model_path, tmp_path, argv, message):
    corrupt = tmp_path / "bad.gguf"
    corrupt.write_bytes(b"GGML" + b"\0" * 60)
    argv = [a.format(gemma=model_path("gemma3"), corrupt=corrupt) for a in argv]
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    assert message in err
    assert "Traceback" not in err


def test_models_list_and_path(capsys):
    rc, out, _ = run(capsys, "models", "list")
    assert rc == 0
    for name in catalog.MODELS:
        assert name in out
    rc, out, _ = run(capsys, "models", "path", "gemma3")
    assert out.strip() == str(catalog.model_path("gemma3"))


def test_bench_open_prints_figures(capsys, model_path):
    rc, out, _ = run(capsys, "bench", "open", "--repeat", "1", str(model_path("smollm2")))
    assert rc == 0
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out and "median ms" in out


def test_console_script_entry_point(tmp_path):
    path = write_all_types(tmp_path / "x.gguf")
    exe = [sys.executable, "-m", "quantscope.cli", "inspect", "--json", str(path)]
    res = subprocess.run(exe, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["architecture"] == "llama"


def test_bench_kernels_reports_prefill_gemm_against_row_dots():
    from quantscope.core.bench import bench_kernels, render_kernels

    r = bench_kernels(types=("Q5_0",), threads=(1,), big=False, dequant=False)
    rows = r["gemm"]
    assert [g["shape"] for g in rows] == ["model 896x4864", "model 4864x896"]
    assert all(g["gemm_gmac_s"] > 0 and g["dots_gmac_s"] > 0 and g["cols"] == 128 for g in rows)
    text = render_kernels(r)
    assert "tiled GEMM" in text and "Q5_0    model 896x4864" in text


def test_peak_rss_is_the_process_own_not_its_parents():
    """`quantscope bench`'s peak RSS: a small child of a large parent reports its own size (ru_maxrss would carry
    the parent's across fork and exec)."""
    import subprocess
    import sys

    import numpy as np

    from quantscope.core.bench import peak_rss_bytes

    big = np.ones(300 << 20, dtype=np.uint8)  # 300 MiB resident in this process
    assert peak_rss_bytes() >= big.nbytes
    out = subprocess.run([sys.executable, "-c", "from quantscope.core.bench import peak_rss_bytes; "
                          "import numpy as np; a = np.ones(64 << 20, dtype=np.uint8); print(peak_rss_bytes())"],
                         capture_output=True, text=True, check=True).stdout
    child = int(out)
    assert 64 << 20 <= child < 200 << 20
