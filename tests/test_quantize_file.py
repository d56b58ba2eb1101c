"""`quantscope quantize` against llama-quantize: the same file, byte for byte (tests/data/quantize/files.json,
recorded by tests/record_quantize_fixtures.py), for every supported preset, with and without an importance matrix,
with per-tensor options and requantization; and the refusals."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli import main as cli
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant.imatrix import read_imatrix
from quantscope.core.quant.quantize import QuantizeError, QuantizeOptions, plan_quantize, quantize_file

from . import quantize_models

DATA = Path(__file__).parent / "data" / "quantize"
META = json.loads((DATA / "files.json").read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three models (checked against the recorded hashes) and the imatrix files, in one folder."""
    d = tmp_path_factory.mktemp("quantize")
    for m in quantize_models.MODELS:
        p = quantize_models.write_model(m, d / f"{m}.gguf")
        assert hashlib.sha256(p.read_bytes()).hexdigest() == META["models"][m], f"{m}: the model bytes changed"
    for f in DATA.glob("*.imatrix.*"):
        shutil.copy(f, d / f.name)
    return d


def _case_id(c: dict) -> str:
    rules = f"-rules-{c['rules'].split('.')[1]}" if "rules" in c else ""
    return f"{c['model']}{'-' + c['input'] if 'input' in c else ''}{rules}-{'-'.join(c['args'])}"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("case", META["runs"], ids=_case_id)
def test_same_file_as_llama_quantize(case: dict, work: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(work)
    m = case["model"]
    inp = f"{m}.gguf"
    if "input" in case:  # a recorded output as the input: made here by the same command (its own case checks it)
        inp = f"{m}-input-{case['input']}.gguf"
        if not (work / inp).exists():
            assert cli.main(["quantize", f"{m}.gguf", inp, case["input"], "--threads", "1"]) == 0
    out = work / f"out-{_case_id(case).replace('=', '_').replace('*', 'x')}.gguf"
    args = list(case["args"])
    if "rules" in case:  # llama-quantize had each line as a --tensor-type argument
        args[:0] = ["--tensor-type-file", str(DATA / case["rules"])]
    rc = cli.main(["quantize", *args[:-1], inp, str(out.name), args[-1]])
    assert rc == 0, capsys.readouterr().err
    assert out.stat().st_size == case["size"]
    assert _sha(out) == case["sha256"], "not llama-quantize's bytes"
    out.unlink()


def test_every_recorded_preset_is_covered() -> None:
    from quantscope.core.quant.mixture import PRESETS

    seen = {c["args"][-1] for c in META["runs"]}
    missing = [p for p in PRESETS if p not in seen and p not in ("Q3_K", "Q4_K", "Q5_K")]
    # the lattice presets need quantizers Quantscope does not have yet (refused: test_unsupported_preset)
    assert set(missing) <= {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_S", "IQ3_M",
                            "IQ3_XS"}, missing


def test_dry_run_json_lists_types_and_sizes(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["quantize", str(work / "llama.gguf"), "Q4_K_M", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {t["name"]: t for t in doc["tensors"]}
    assert by["output.weight"]["to"] == "Q6_K" and by["output.weight"]["reason"] == "rule"
    assert by["blk.0.attn_norm.weight"]["to"] == "F32" and by["blk.0.attn_norm.weight"]["reason"] == "kept"
    assert by["blk.1.attn_q.weight"]["to"] == "Q4_K"
    rec = next(c for c in META["runs"] if c["model"] == "llama" and c["args"] == ["Q4_K_M"])
    assert doc["summary"]["file_bytes"] == rec["size"]
    assert not list(work.glob("*Q4_K_M*.gguf.tmp*"))


def test_fallback_is_reported(work: Path) -> None:
    with GGUFFile(work / "qwen2.gguf") as f:
        plan = plan_quantize(f, QuantizeOptions("Q4_K_M"))
    down = [j for j in plan.jobs if "ffn_down" in j.info.name]
    assert {j.choice.target for j in down} <= {"Q5_0", "Q8_0"} and all(j.choice.reason == "fallback" for j in down)
    assert any("ffn_down" in w and "544" in w for w in plan.warnings)


@pytest.mark.parametrize("preset", ["IQ2_XXS", "IQ3_M", "IQ1_S"])
def test_unsupported_preset(preset: str, work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = work / "never.gguf"
    args = ["quantize", str(work / "llama.gguf"), str(out), preset]
    if preset in ("IQ2_XXS", "IQ1_S"):
        args[1:1] = ["--imatrix", str(work / "llama.imatrix.gguf")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantscope: error: ") and "no quantizer" in err and err.count("\n") == 1
    assert not out.exists()


def test_refusals(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    llama = str(work / "llama.gguf")
    # requantizing needs the flag
    q8 = work / "refuse-q8.gguf"
    assert cli.main(["quantize", llama, str(q8), "Q8_0"]) == 0
    assert cli.main(["quantize", str(q8), str(work / "x.gguf"), "Q4_K_M"]) == 2
    assert "requantizing is disabled" in capsys.readouterr().err
    # Q2_K_S without importance data
    assert cli.main(["quantize", llama, str(work / "x.gguf"), "Q2_K_S"]) == 2
    assert "needs an importance matrix" in capsys.readouterr().err
    # an imatrix entry of the wrong size (another model's)
    name = b"blk.0.attn_q.weight"
    dat = work / "wrong.imatrix.dat"
    dat.write_bytes(struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii", 10, 100)
                    + np.ones(100, np.float32).tobytes())
    assert cli.main(["quantize", "--imatrix", str(dat), llama, str(work / "x.gguf"), "Q4_K_M"]) == 2
    assert "the imatrix entry has 100 values; the tensor needs 256" in capsys.readouterr().err
    # a truncated imatrix file
    dat.write_bytes(struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii", 10, 256) + b"\0" * 40)
    assert cli.main(["quantize", "--imatrix", str(dat), llama, str(work / "x.gguf"), "Q4_K_M"]) == 2
    assert "claims 256 values" in capsys.readouterr().err
    # the output may not be the input
    assert cli.main(["quantize", llama, llama, "Q4_0"]) == 2
    assert "input file" in capsys.readouterr().err
    assert cli.main(["quantize", llama, str(work / "x.gguf"), "Q9_K"]) == 2
    assert "unknown quantization type" in capsys.readouterr().err
    assert cli.main(["quantize", "--tensor-type", "attn=Q9", llama, str(work / "x.gguf"), "Q4_0"]) == 2
    assert "unknown ggml type" in capsys.readouterr().err
    assert cli.main(["quantize", "--tensor-type", "attn(=q8_0", llama, str(work / "x.gguf"), "Q4_0"]) == 2
    assert "regular expression" in capsys.readouterr().err
    assert not (work / "x.gguf").exists()


def test_non_finite_weights_are_refused(work: Path, tmp_path: Path) -> None:
    bad = tmp_path / "nan.gguf"
    data = bytearray((work / "llama.gguf").read_bytes())
    with GGUFFile(work / "llama.gguf") as f:
        t = f.tensor("blk.2.ffn_up.weight")
        off = t.data_offset + 4 * (3 * t.ne[0] + 5)
    data[off:off + 4] = np.float32(np.nan).tobytes()
    bad.write_bytes(bytes(data))
    with pytest.raises(QuantizeError, match=r"blk.2.ffn_up.weight .* row 3"):
        quantize_file(bad, tmp_path / "out.gguf", QuantizeOptions("Q4_K_M"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.gguf"]


def test_cancel_leaves_nothing(work: Path, tmp_path: Path) -> None:
    from quantscope.core.quant.quantize import QuantizeCancelled

    class After:
        def __init__(self) -> None:
            self.calls = 0

        @property
        def cancelled(self) -> bool:
            self.calls += 1
            return self.calls > 5

    with pytest.raises(QuantizeCancelled):
        quantize_file(work / "qwen3moe.gguf", tmp_path / "out.gguf", QuantizeOptions("Q4_K_M"), cancel=After())
    assert list(tmp_path.iterdir()) == []


def test_imatrix_formats_agree(work: Path) -> None:
    """The legacy file holds the same statistics: the weights the quantizer gets agree to float rounding."""
    g = read_imatrix(work / "llama.imatrix.gguf")
    d = read_imatrix(work / "llama.imatrix.dat")
    assert not g.is_legacy and d.is_legacy
    assert set(g.entries) == set(d.entries) and g.chunk_count == d.chunk_count == 8
    assert g.datasets and d.datasets
    for name in g.entries:
        wg, wd = g.weights(name), d.weights(name)
        assert wg is not None and wd is not None
        np.testing.assert_allclose(wg, wd, rtol=1e-5)
