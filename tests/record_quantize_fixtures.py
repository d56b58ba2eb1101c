"""Record ggml's quantizer output for the quantizer byte-identity tests (tests/test_quantize_native.py) and
llama-quantize's output files for the file tests (tests/test_quantize_file.py).

ggml's ``ggml_quantize_chunk`` comes from the llama.cpp oracle build (tests/bench/llamacpp_build.py: the
llama-cpp-python sdist's vendor/llama.cpp): tests/oracle/quantize_oracle.c is linked against its libggml-base.a
and run once per type, input set and importance setting. The inputs are tests/quantize_inputs.py's generated sets
plus real rows of SmolLM2-135M-Instruct (its blk.0.ffn_down, dequantized). Written to
tests/data/quantize/ggml_rows.npz (inputs ``in_*``/``im_*`` of the real set, outputs ``TYPE/SET/plain|imatrix``)
and meta.json.

Files: the tiny models of tests/quantize_models.py are written, llama-imatrix computes an importance matrix for each
over tests/data/english.txt (``-c 128``; committed as ``MODEL.imatrix.gguf``, and for llama also in the legacy
format as ``llama.imatrix.dat``), and llama-quantize runs every case of :func:`file_cases` with the working directory
holding the imatrix files (the path it writes into the metadata is the relative one). files.json records each
model's SHA-256 and, per case, the arguments and the SHA-256 and size of llama-quantize's output (``input``: the
case quantizes that preset's recorded output instead of the model, e.g. ``Q8_0`` with ``--allow-requantize``;
``rules``: a rule file of tests/data/quantize -- a ``--target-size`` mix Quantscope chose -- given to llama-quantize
as one ``--tensor-type`` per line, and to Quantscope as ``--tensor-type-file``).

Usage: python tests/record_quantize_fixtures.py [--llama-build DIR] [--only rows|files|new-files]
(``new-files``: run only the cases files.json lacks, with the committed imatrix files.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "bench"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import llamacpp_build  # noqa: E402
import quantize_inputs  # noqa: E402

from quantscope.core.base.ggml_types import ggml_type  # noqa: E402
from quantscope.core.catalog import model_path  # noqa: E402
from quantscope.core.gguf import GGUFFile  # noqa: E402
from quantscope.core.quant import dequantize  # noqa: E402
from tests import quantize_models  # noqa: E402

OUT = HERE / "data" / "quantize"


def real_set() -> tuple[np.ndarray, np.ndarray]:
    f = GGUFFile(model_path("smollm2"))
    t = f.tensor("blk.0.ffn_down.weight")
    rows = np.ascontiguousarray(dequantize(f.tensor_rows(t)[:4], t.type_name), dtype=np.float32).reshape(4, -1)
    rng = np.random.default_rng(1804)
    imat = (rng.gamma(0.6, 1.0, rows.shape[1]) ** 2).astype(np.float32)
    return rows, imat


def compile_oracle(build: Path, src: Path, out: Path) -> Path:
    inc = build.parent / "src" / "ggml" / "include"
    subprocess.run(["gcc", "-O2", "-o", str(out), str(HERE / "oracle" / "quantize_oracle.c"), f"-I{inc}",
                    "-Wl,--whole-archive", str(build / "ggml" / "src" / "libggml-base.a"), "-Wl,--no-whole-archive",
                    "-lm", "-lstdc++", "-lpthread", "-fopenmp"], check=True)
    return out


#: presets whose every tensor type Quantscope quantizes (llama-quantize's names)
PRESETS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
           "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE", "F16", "BF16", "F32")
IMATRIX_PRESETS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q4_K_M", "Q5_K_S",
                   "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0")


def file_cases() -> list[dict[str, object]]:
    """Every (model, input, arguments) the file tests run; ``input`` is the model itself or a recorded output."""
    cases: list[dict[str, object]] = []
    for m in quantize_models.MODELS:
        cases += [{"model": m, "args": [p]} for p in PRESETS]
        cases += [{"model": m, "args": ["--imatrix", f"{m}.imatrix.gguf", p]} for p in IMATRIX_PRESETS]
    cases += [
        {"model": "llama", "args": ["--pure", "Q4_K_M"]},
        {"model": "llama", "args": ["--output-tensor-type", "q8_0", "--token-embedding-type", "q5_0", "Q4_K_M"]},
        {"model": "qwen2", "args": ["--token-embedding-type", "iq4_nl", "Q5_K_M"]},
        {"model": "llama", "args": ["--tensor-type", "ffn_down=q8_0", "--tensor-type", "attn_.*=iq4_nl", "Q5_K_M"]},
        {"model": "qwen3moe", "args": ["--tensor-type", "exps=q2_k", "--imatrix", "qwen3moe.imatrix.gguf", "Q4_K_S"]},
        {"model": "llama", "args": ["--leave-output-tensor", "Q4_0"]},
        {"model": "llama", "args": ["--imatrix", "llama.imatrix.dat", "IQ4_XS"]},
        {"model": "llama", "input": "Q8_0", "args": ["--allow-requantize", "Q4_K_M"]},
        {"model": "qwen2", "input": "Q8_0",
         "args": ["--allow-requantize", "--imatrix", "qwen2.imatrix.gguf", "Q3_K_M"]},
        # target-size mixes (quantscope quantize --target-size at the Q4_K_M preset's size, -f english.txt, the
        # same imatrix): the rule file and the preset the CLI names beside it
        {"model": "llama", "rules": "llama.target.tensor-types.txt",
         "args": ["--imatrix", "llama.imatrix.gguf", "Q5_K_M"]},
        {"model": "qwen3moe", "rules": "qwen3moe.target.tensor-types.txt",
         "args": ["--imatrix", "qwen3moe.imatrix.gguf", "Q6_K"]},
    ]
    return cases


def rule_args(name: str) -> list[str]:
    """A rule file as llama-quantize's arguments: ``--tensor-type LINE`` per non-empty line."""
    lines = (OUT / name).read_text(encoding="utf-8").splitlines()
    return [a for line in lines if line.strip() for a in ("--tensor-type", line.strip())]


def record_files(bin_dir: Path, only_new: bool = False) -> None:
    work = Path(tempfile.mkdtemp(prefix="qs-quantize-"))
    models: dict[str, str] = {}
    old = json.loads((OUT / "files.json").read_text()) if only_new else None
    for m in quantize_models.MODELS:
        path = quantize_models.write_model(m, work / f"{m}.gguf")
        models[m] = hashlib.sha256(path.read_bytes()).hexdigest()
        if old is not None:
            if old["models"][m] != models[m]:
                raise SystemExit(f"{m}: the model bytes changed since files.json was recorded: record every case")
            for f in OUT.glob(f"{m}.imatrix.*"):
                (work / f.name).write_bytes(f.read_bytes())
            continue
        for fmt, ext in (("gguf", "gguf"), ("dat", "dat")):
            if fmt == "dat" and m != "llama":
                continue
            subprocess.run([str(bin_dir / "llama-imatrix"), "-m", str(path), "-f", str(HERE / "data" / "english.txt"),
                            "-c", "128", "-t", "2", "--output-format", fmt, "-o", str(work / f"{m}.imatrix.{ext}")],
                           check=True, capture_output=True)
            (OUT / f"{m}.imatrix.{ext}").write_bytes((work / f"{m}.imatrix.{ext}").read_bytes())
    runs = list(old["runs"]) if old is not None else []
    have = [{k: v for k, v in r.items() if k not in ("sha256", "size")} for r in runs]
    for c in file_cases():
        if c in have:
            continue
        m = str(c["model"])
        inp = f"{m}.gguf" if "input" not in c else f"{m}-input-{c['input']}.gguf"
        if "input" in c and not (work / inp).exists():  # only_new: make the input the way its own case did
            subprocess.run([str(bin_dir / "llama-quantize"), f"{m}.gguf", inp, str(c["input"]), "2"], cwd=work,
                           check=True, capture_output=True)
        args = [str(x) for x in c["args"]]  # type: ignore[attr-defined]
        out = f"{m}-{'-'.join(a.replace('=', '_').replace('*', 'x') for a in args)}.gguf"
        rules = rule_args(str(c["rules"])) if "rules" in c else []
        cmd = [str(bin_dir / "llama-quantize"), *rules, *args[:-1], inp, out, args[-1], "2"]
        r = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"llama-quantize failed: {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        if args == ["Q8_0"]:
            (work / f"{m}-input-Q8_0.gguf").write_bytes((work / out).read_bytes())
        data = (work / out).read_bytes()
        runs.append({**c, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        (work / out).unlink()
    meta = {"llama.cpp": f"vendor/llama.cpp of the llama-cpp-python {llamacpp_build.VERSION} sdist",
            "tool": "llama-quantize (2 threads), llama-imatrix -c 128 over tests/data/english.txt",
            "models": models, "runs": runs}
    (OUT / "files.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"recorded {len(runs)} llama-quantize runs into {OUT / 'files.json'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-build", type=Path, default=None)
    ap.add_argument("--only", choices=("rows", "files", "new-files"))
    a = ap.parse_args()
    build = a.llama_build or Path(llamacpp_build.build()).parent
    OUT.mkdir(parents=True, exist_ok=True)
    if a.only != "rows":
        record_files(build / "bin", only_new=a.only == "new-files")
    if a.only in ("files", "new-files"):
        return 0
    sets = quantize_inputs.generated_sets()
    sets["real"] = real_set()
    arrays: dict[str, np.ndarray] = {"in_real": sets["real"][0], "im_real": sets["real"][1]}
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        exe = compile_oracle(build, HERE, t / "quantize_oracle")
        for sname, (rows, imat) in sets.items():
            rows.tofile(t / "rows.f32")
            imat.tofile(t / "imat.f32")
            for tname in quantize_inputs.TYPES:
                gt = ggml_type(tname)
                for mode, im in (("plain", "-"), ("imatrix", str(t / "imat.f32"))):
                    subprocess.run([str(exe), str(gt.id), str(rows.shape[0]), str(rows.shape[1]), str(t / "rows.f32"),
                                    im, str(t / "out.bin")], check=True)
                    data = np.fromfile(t / "out.bin", np.uint8)
                    assert data.size == rows.shape[0] * gt.row_bytes(rows.shape[1]), (tname, sname)
                    arrays[f"{tname}/{sname}/{mode}"] = data
    np.savez_compressed(OUT / "ggml_rows.npz", **arrays)
    digest = hashlib.sha256((OUT / "ggml_rows.npz").read_bytes()).hexdigest()
    meta = {"llama.cpp": f"vendor/llama.cpp of the llama-cpp-python {llamacpp_build.VERSION} sdist",
            "oracle": "ggml_quantize_chunk (tests/oracle/quantize_oracle.c against libggml-base.a)",
            "sets": {k: list(v[0].shape) for k, v in sets.items()}, "types": list(quantize_inputs.TYPES),
            "sha256": digest}
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {OUT / 'ggml_rows.npz'} ({(OUT / 'ggml_rows.npz').stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
