"""Record llama.cpp's tokenization with Mistral's ``tekken`` pre-tokenizer (no vocab test file in llama.cpp has it).

The vocabulary is llama.cpp's llama-bpe test vocabulary with ``tokenizer.ggml.pre = tekken`` (:func:`tekken_vocab`);
the texts are the cases of llama.cpp's llama-bpe vocab test plus a few where
tekken differs from other expressions (:data:`EXTRA`). llama-tokenize
(``--stdin --ids --no-bos``) writes ``tests/data/tekken.json``, which tests/test_vocab_suite.py compares with.
Usage: python tests/record_tekken.py [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

import llamacpp_build  # noqa: E402
from test_vocab_suite import cases, vocab_dir  # noqa: E402


def tekken_vocab(dest: Path) -> Path:
    """llama.cpp's llama-bpe test vocabulary (Llama 3's 128k tokens, with multi-digit and mixed-case tokens)
    rewritten with ``tokenizer.ggml.pre = tekken``: a vocabulary where the pre-tokenizer's splits matter."""
    import gguf

    r = gguf.GGUFReader(str(vocab_dir() / "ggml-vocab-llama-bpe.gguf"))
    w = gguf.GGUFWriter(str(dest), "llama")
    T = gguf.GGUFValueType
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = "tekken" if name == "tokenizer.ggml.pre" else field.contents()
        kind = field.types[0]
        if kind == T.STRING:
            w.add_string(name, value)
        elif kind == T.UINT32:
            w.add_uint32(name, value)
        elif kind == T.FLOAT32:
            w.add_float32(name, value)
        elif kind == T.ARRAY:
            w.add_array(name, value)
        else:
            raise ValueError(f"{name}: unexpected type {kind}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


#: texts where tekken differs from the Llama 3 and GPT-2 expressions (case runs, single digits, slashes, accents)
EXTRA = ["HelloWorld camelCaseName XMLHttpRequest", "12345 67 8.90", "path/to/file.txt foo//bar\n/x",
         "ÉCOLE élève Größe ÀÉÎ", "iPhone eBay McDonald's", "ABCdef abcDEF", "x=1;y=22/7"]


def texts() -> list[str]:
    return [t for t, _ in cases(vocab_dir() / "ggml-vocab-llama-bpe.gguf")] + EXTRA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path)
    a = ap.parse_args()
    tokenize = str(Path(a.llama_bin or llamacpp_build.build()) / "llama-tokenize")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        model = tekken_vocab(Path(tmp) / "tekken.gguf")
        for text in texts():
            run = subprocess.run([tokenize, "-m", str(model), "--stdin", "--ids", "--no-bos", "--log-disable"],
                                 input=text.encode("utf-8"), capture_output=True, check=True)
            out.append([text, ast.literal_eval(run.stdout.decode().strip().splitlines()[-1])])
    meta = {"llama.cpp": f"vendor/llama.cpp of the llama-cpp-python {llamacpp_build.VERSION} sdist",
            "command": "llama-tokenize -m FIXTURE --stdin --ids --no-bos", "cases": out}
    (HERE / "data" / "tekken.json").write_text(json.dumps(meta, ensure_ascii=False) + "\n", encoding="utf-8")
    print(len(out), "cases")


if __name__ == "__main__":
    main()
