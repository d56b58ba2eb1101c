"""Importance matrices computed by Quantscope's engine against llama-imatrix's (tests/data/quantize, recorded by
tests/record_quantize_fixtures.py over the same text and chunks), the GGUF writer, the native statistics hooks and
`quantscope imatrix -f`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantscope.cli import main as cli
from quantscope.core.engine.imatrix import compute_imatrix
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant.imatrix import read_imatrix, write_imatrix
from quantscope.core.quant.quantize import QuantizeOptions, plan_quantize

from . import quantize_models

DATA = Path(__file__).parent / "data"
TEXT = (DATA / "english.txt").read_text()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("imatrix")
    for m in quantize_models.MODELS:
        quantize_models.write_model(m, d / f"{m}.gguf")
    return d


@pytest.mark.parametrize("model", quantize_models.MODELS)
def test_same_statistics_as_llama_imatrix(model: str, models: Path) -> None:
    ours = compute_imatrix(models / f"{model}.gguf", TEXT, n_ctx=128, threads=2)
    ref = read_imatrix(DATA / "quantize" / f"{model}.imatrix.gguf")
    assert ours.chunk_count == ref.chunk_count == 8 and ours.chunk_size == ref.chunk_size == 128
    # llama-imatrix also records the routers' input; routers are never quantized, so it is not collected here
    assert set(ref.entries) - set(ours.entries) == {n for n in ref.entries if "ffn_gate_inp" in n}
    assert set(ours.entries) <= set(ref.entries)
    for name, e in ours.entries.items():
        r = ref.entries[name]
        assert e.sums.shape == r.sums.shape and e.n_mat == r.n_mat, name
        assert np.array_equal(e.counts, r.counts), name  # per expert too: the same routing
        rel = np.abs(e.sums - r.sums).max() / np.abs(r.sums).max()
        assert rel < 2e-3, (name, rel)


def test_written_file_reads_back_and_drives_quantize(models: Path, tmp_path: Path) -> None:
    im = compute_imatrix(models / "qwen3moe.gguf", TEXT, n_ctx=128, max_chunks=3, dataset="english.txt")
    assert im.chunk_count == 3
    path = write_imatrix(im, tmp_path / "q.imatrix.gguf")
    back = read_imatrix(path)
    assert not back.is_legacy and back.datasets == ["english.txt"] and back.chunk_count == 3
    assert back.chunk_size == 128 and set(back.entries) == set(im.entries)
    for n, e in im.entries.items():
        assert np.array_equal(back.entries[n].sums, e.sums) and np.array_equal(back.entries[n].counts, e.counts)
    with GGUFFile(path) as f:  # llama-imatrix's layout: its keys in its order, entries in name order
        assert list(f.metadata)[-4:] == ["general.type", "imatrix.datasets", "imatrix.chunk_count",
                                         "imatrix.chunk_size"]
        assert f.get("general.type") == "imatrix"
        names = [t.name for t in f.tensors]
        assert names == [f"{n}{s}" for n in sorted(im.entries) for s in (".in_sum2", ".counts")]
        exps = f.tensor("blk.0.ffn_down_exps.weight.in_sum2")
        assert tuple(exps.ne) == (256, 8) and tuple(f.tensor("blk.0.attn_q.weight.counts").ne) == (1,)
    import gguf

    r = gguf.GGUFReader(str(path))  # a valid GGUF for gguf-py too
    assert len(r.tensors) == 2 * len(im.entries)
    with GGUFFile(models / "qwen3moe.gguf") as f:
        plan = plan_quantize(f, QuantizeOptions("IQ4_XS", back))
    assert all(j.has_imatrix for j in plan.jobs if j.converts and "blk." in j.info.name)


def test_hooks_check_sizes_and_skip_decode_steps(models: Path) -> None:
    from quantscope.core.engine.generate import Engine
    from quantscope.core.native.mapped import KernelError

    eng = Engine(str(models / "llama.gguf"), n_ctx=64, backend="cpu")
    try:
        s = eng.new_session(64)
        n = eng.model.config.n_layers
        stats = [{"attn": np.zeros(256, np.float32), "ffn": np.zeros(256, np.float32)} for _ in range(n)]
        s.set_activation_stats(stats)
        s.forward([5], logits=False)  # a decode step: not counted
        assert all(not st["attn"].any() for st in stats)
        s.forward([6, 7, 8], logits=False)
        assert all(st["attn"].all() and st["ffn"].all() for st in stats)
        s.set_activation_stats([{"attn": np.zeros(255, np.float32)} for _ in range(n)])
        with pytest.raises(KernelError):
            s.forward([9, 10], logits=False)
        with pytest.raises(ValueError, match="float32"):
            s.set_activation_stats([{"attn": np.zeros(256, np.float64)} for _ in range(n)])
        s.set_activation_stats(None)
        s.forward([11, 12], logits=False)
    finally:
        eng.close()


def test_cli_compute_and_errors(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.imatrix.gguf"
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert cli.main(["imatrix", str(models / "llama.gguf"), "-f", str(text), "-c", "128", "--chunks", "2",
                     "-o", str(out)]) == 0
    assert "28 entries, 2 chunks of 128" in capsys.readouterr().out
    assert read_imatrix(out).datasets == [str(text)]
    for args, msg in ((["-p", "too short", "-c", "128"], "at least 128"),
                      (["-f", str(text), "-p", "x"], "not both"),
                      (["-f", str(text), "-o", str(models / "llama.gguf")], "input file"),
                      (["-f", str(text), "-c", "4096"], "longer than the model's"),
                      (["-o", str(out)], "give the text")):
        assert cli.main(["imatrix", str(models / "llama.gguf"), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("quantscope: error: ") and msg in err and err.count("\n") == 1, err


def test_cli_backend_choice(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--backend`` reaches the engine: cuda where it cannot run is one line naming the reason (no GPU here, or a
    GPU that refuses this model); cpu computes as by default."""
    from quantscope.core.engine import cuda_backend

    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "m.imatrix.gguf"
    assert cli.main(["imatrix", str(models / "llama.gguf"), "-f", str(text), "-c", "128", "--chunks", "1",
                     "-o", str(out), "--backend", "cpu"]) == 0
    assert read_imatrix(out).chunk_count == 1
    capsys.readouterr()
    if cuda_backend.cuda_status()[0]:
        pytest.skip("a usable GPU is here: the refusal below needs none")
    assert cli.main(["imatrix", str(models / "llama.gguf"), "-f", str(text), "-c", "128", "--chunks", "1",
                     "-o", str(tmp_path / "g.imatrix.gguf"), "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantscope: error: --backend cuda: ") and err.count("\n") == 1, err
    assert not (tmp_path / "g.imatrix.gguf").exists()
