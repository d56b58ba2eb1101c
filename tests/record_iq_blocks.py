"""Record real blocks of the i-quants, ternary and FP4 types for tests/test_iquants.py.

SmolLM2-135M (the catalogue's Q4_1 file, dequantized and written back as F16 with gguf-py) gets an importance
matrix from llama-imatrix over tests/data/english.txt; then llama-quantize writes its ffn_down matrices (rows of
1536, whole 256-element blocks) in each type (``--tensor-type ffn_down=TYPE``, the rest Q8_0). The first 64 blocks
of blk.0.ffn_down.weight go to ``tests/data/iq_blocks/TYPE.bin``; for the types with a repacked layout (IQ4_NL,
IQ4_XS, Q2_K, Q3_K) its first 16 rows go to ``TYPE-rows.bin`` (one row group for tests/test_repack.py).
``meta.json`` says where they came from. ``--types`` re-records only those types and keeps the other files.

llama-imatrix and llama-quantize come from ``--llama-bin DIR`` or tests/bench/llamacpp_build.py.
Usage: python tests/record_iq_blocks.py [--llama-bin DIR] [--types IQ4_NL,IQ4_XS]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "bench"))

import llamacpp_build  # noqa: E402

OUT = HERE / "data" / "iq_blocks"
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]
N_BLOCKS = 64
ROW_TYPES = ["IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K"]  # recorded as 16 whole rows
N_ROWS = 16


def write_f16(src: Path, dst: Path) -> None:
    """``src`` with every matrix dequantized and stored as F16 (vectors F32), metadata copied."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                w.add_array(f.name, [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data])
            else:
                w.add_array(f.name, [f.parts[i][0].item() for i in f.data])
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(f.name, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(f.name, f.parts[f.data[0]][0].item(), t)
    for ti in r.tensors:
        a = gguf.quants.dequantize(ti.data, ti.tensor_type).astype(np.float32)
        w.add_tensor(ti.name, a.astype(np.float16) if a.ndim >= 2 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path)
    ap.add_argument("--types", help="comma-separated subset to re-record (default: all)")
    a = ap.parse_args()
    todo = a.types.split(",") if a.types else TYPES + ROW_TYPES
    from quantscope.core import catalog
    from quantscope.core.gguf import GGUFFile

    bin_dir = Path(a.llama_bin or llamacpp_build.build())
    OUT.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {
        "llama.cpp": f"vendor/llama.cpp of the llama-cpp-python {llamacpp_build.VERSION} sdist",
        "source": "SmolLM2-135M-Instruct Q4_1 (catalogue) -> F16 -> llama-quantize --imatrix ... "
                  "--tensor-type ffn_down=TYPE Q8_0", "tensor": "blk.0.ffn_down.weight", "blocks": N_BLOCKS,
        "types": [], "rows": []}
    old = OUT / "meta.json"
    if a.types and old.exists():
        prev = json.loads(old.read_text(encoding="utf-8"))
        meta["types"] = [t for t in prev.get("types", []) if t not in todo]
        meta["rows"] = [t for t in prev.get("rows", []) if t not in todo]
    with tempfile.TemporaryDirectory() as tmp:
        f16 = Path(tmp) / "f16.gguf"
        write_f16(catalog.fetch("smollm2"), f16)
        imatrix = Path(tmp) / "imatrix.gguf"
        subprocess.run([str(bin_dir / "llama-imatrix"), "-m", str(f16), "-f", str(HERE / "data" / "english.txt"),
                        "-c", "128", "-o", str(imatrix), "-t", "2"], check=True, capture_output=True)
        for name in todo:
            out = Path(tmp) / f"{name}.gguf"
            run = subprocess.run([str(bin_dir / "llama-quantize"), "--imatrix", str(imatrix), "--tensor-type",
                                  f"ffn_down={name.lower()}", str(f16), str(out), "Q8_0", "2"],
                                 capture_output=True, text=True)
            if run.returncode:
                print(name, "failed:", run.stderr.strip().splitlines()[-1:])
                continue
            with GGUFFile(out) as f:
                t = f.tensor("blk.0.ffn_down.weight")
                if t.type is None or t.type.name != name:
                    print(name, "not written:", t.type_name)
                    continue
                rows = name in ROW_TYPES
                n = N_ROWS * t.row_bytes if rows else N_BLOCKS * t.type.block_bytes
                raw = np.asarray(f.tensor_bytes(t))[:n]
            (OUT / (f"{name}-rows.bin" if rows else f"{name}.bin")).write_bytes(raw.tobytes())
            meta["rows" if rows else "types"].append(name)  # type: ignore[union-attr]
            print(name, "ok")
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
