"""The native piece table and BPE (csrc/qs_vocab.c) against a plain-Python reference of the same algorithm, on real
vocabularies (the test models and llama.cpp's vocab files) and on a crafted one with duplicate pieces and merges;
its size checks; and the tokenize command's numpy-free start-up."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType as V
from gguf import GGUFWriter

from quantscope.core import catalog
from quantscope.core.gguf import GGUFFile
from quantscope.core.native import ffi, lib
from quantscope.core.tokenizer import CONTROL, Tokenizer, bytes_to_unicode, regex_split

ROOT = Path(__file__).resolve().parent.parent


def reference_tables(f: GGUFFile) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """piece -> first id and (left, right) -> first rank, as dicts."""
    vocab: dict[str, int] = {}
    for i, p in enumerate(f.get("tokenizer.ggml.tokens")):
        vocab.setdefault(p, i)
    ranks: dict[tuple[str, str], int] = {}
    for r, m in enumerate(f.get("tokenizer.ggml.merges")):
        a, sp, b = m.partition(" ")
        if sp:
            ranks.setdefault((a, b), r)
    return vocab, ranks


def reference_merge(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Byte-pair merging in Python: the lowest-ranked adjacent pair (leftmost of equals), every occurrence, left to
    right, until no pair has a rank."""
    parts = list(word)
    while len(parts) > 1:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get((parts[i], parts[i + 1]))
            if r is not None and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            break
        a, b = parts[best_i], parts[best_i + 1]
        merged: list[str] = []
        i = 0
        while i < len(parts):
            if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                merged.append(a + b)
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


def reference_bpe(tok: Tokenizer, vocab: dict[str, int], ranks: dict[tuple[str, str], int], word: str) -> list[int]:
    """The ids Tokenizer._bpe must give for one pre-tokenized word."""
    enc = bytes_to_unicode()
    if not tok.spm_style:
        word = "".join(enc[b] for b in word.encode("utf-8"))
        if word in vocab and tok.types[vocab[word]] != CONTROL:
            return [vocab[word]]
    out: list[int] = []
    for p in reference_merge(word, ranks):
        if p in vocab:
            out.append(vocab[p])
        elif tok.spm_style:
            out.extend(tok.byte_ids[b] for b in p.encode("utf-8") if b in tok.byte_ids)
        else:
            out.extend(vocab.get(ch, tok.unk_id if tok.unk_id is not None else 0) for ch in p)
    return out


def sample_words(tok: Tokenizer, seed: int) -> list[str]:
    """Pre-tokenized words of the project's docs, random Unicode and random byte-like strings."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))[:40_000]
    if tok.spm_style:
        text = text.replace(" ", "▁")
    words = sorted(set(regex_split(text, tok.exprs)))
    rng = random.Random(seed)
    alphabet = ("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:'\"!?-_()[]{}<>/\\\n\t"
                "àéîõüßçñ€£¥©®™—–…«»中文日本語한국어Привет")
    for _ in range(300):
        words.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))))
    for _ in range(100):
        words.append("".join(chr(rng.choice((rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                                              rng.randint(0x10000, 0x1F9FF)))) for _ in range(rng.randint(1, 12))))
    words.append("a" * 200)  # long runs merge pair by pair
    return words


def vocab_file(name: str) -> Path:
    if not catalog.data_present():
        pytest.fail(f"llama.cpp's test data is missing from {catalog.data_dir()}: run `quantscope models fetch`",
                    pytrace=False)
    return catalog.data_dir() / "vocab" / f"ggml-vocab-{name}.gguf"


@pytest.mark.parametrize("source", ["smollm2", "qwen2.5-coder",
                                    "vocab:llama-bpe", "vocab:gemma-4", "vocab:deepseek-coder"])
def test_native_bpe_matches_the_reference(source, model_path):
    path = vocab_file(source[6:]) if source.startswith("vocab:") else model_path(source)
    with GGUFFile(path) as f:
        tok = Tokenizer(f)
        vocab, ranks = reference_tables(f)
    words = sample_words(tok, seed=len(source))
    bad = []
    for w in words:
        raw = w.encode("utf-8")
        if (got := tok._bpe(raw)) != (want := reference_bpe(tok, vocab, ranks, w)):
            bad.append((w, got, want))
    assert not bad, f"{len(bad)} of {len(words)} words differ, first: {bad[0]!r}"
    if not tok.spm_style:  # all the words in one call, as encode() does it
        ids, starts = tok.vocab.bpe_words("".join(words), words, byte_map=True)
        if starts is not None:
            ids = [t for w, word in enumerate(words) for t in (
                tok._bpe(word.encode()) if -1 in ids[starts[w]:starts[w + 1]] else ids[starts[w]:starts[w + 1]])]
        assert ids == [t for w in words for t in reference_bpe(tok, vocab, ranks, w)]
    # the piece table gives the first id of every piece, and nothing for what is not a piece
    pieces = list(tok.pieces)
    assert all(tok.vocab.get(p) == vocab[p] for p in pieces)
    assert tok.vocab.get(pieces[0] + "\u0000never") is None and "\udcff" not in tok.vocab
    rng = random.Random(7)
    for (a, b), r in rng.sample(sorted(ranks.items()), 500):
        assert tok.vocab.rank(a, b) == r


def write_vocab(path: Path, pieces: list[str], merges: list[str], types: list[int] | None = None) -> None:
    w = GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt2")
    w.add_key_value("tokenizer.ggml.tokens", pieces, V.ARRAY, sub_type=V.STRING)
    w.add_key_value("tokenizer.ggml.token_type", types or [1] * len(pieces), V.ARRAY, sub_type=V.INT32)
    w.add_key_value("tokenizer.ggml.merges", merges, V.ARRAY, sub_type=V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_duplicates_and_odd_merges(tmp_path):
    """The first id of a repeated piece and the first rank of a repeated pair win; a merge without a space never
    applies; a control token's text is merged like any other word rather than taken whole."""
    pieces = ["a", "b", "c", "ab", "a", "abc", "bc", "ab", "cc", "ccc", "<ctl>", "<", "c", "t", "l", ">", "ct"]
    types = [1] * len(pieces)
    types[10] = CONTROL
    merges = ["b c", "a b", "a b", "ab c", "nospace", "c c", "c t", "< ct"]
    path = tmp_path / "dup.gguf"
    write_vocab(path, pieces, merges, types)
    with GGUFFile(path) as f:
        tok = Tokenizer(f)
    assert tok.vocab["a"] == 0 and tok.vocab["ab"] == 3 and tok.vocab["c"] == 2
    assert tok.vocab.rank("a", "b") == 1 and tok.vocab.rank("b", "c") == 0 and tok.vocab.rank("nospace", "") is None
    assert tok._bpe(b"abc") == [5]  # a word that is a piece is that piece
    assert tok._bpe(b"abcc") == [0, 6, 2]  # "b c" (rank 0) first: a|bc|c, and no (a, bc) merge
    assert tok._bpe(b"ccccc") == [8, 8, 2]  # every occurrence, left to right: cc|cc|c
    # not the control token: <|ct|l|>, then "<ct" (no such piece) falls back to its characters
    assert tok._bpe(b"<ctl>") == [11, 2, 13, 14, 15]
    assert len(tok.vocab) == len(set(pieces)) and sorted(tok.vocab) == sorted(set(pieces))


def test_native_tables_check_their_sizes():
    err = ffi.new("int *")
    one = b"\x01\x00\x00\x00\x00\x00\x00\x00a"
    assert lib.qs_vocab_new(one, len(one) - 1, 1, ffi.NULL, 0, 0, err) == ffi.NULL and err[0] == -1  # runs past
    assert lib.qs_vocab_new(one, len(one), 2, ffi.NULL, 0, 0, err) == ffi.NULL and err[0] == -1  # count > bytes/8
    assert lib.qs_vocab_new(one, len(one), 1, one, 7, 1, err) == ffi.NULL and err[0] == -1  # merges: no length
    huge = b"\xff" * 8 + b"a"
    assert lib.qs_vocab_new(huge, len(huge), 1, ffi.NULL, 0, 0, err) == ffi.NULL and err[0] == -1
    v = lib.qs_vocab_new(one, len(one), 1, ffi.NULL, 0, 0, err)
    assert v != ffi.NULL and err[0] == 0
    try:
        assert lib.qs_vocab_find(v, b"a", 1) == 0 and lib.qs_vocab_find(v, b"b", 1) == -1
        assert lib.qs_vocab_rank(v, b"a", 1, b"a", 1) == -1  # no merges at all
        ids, ends = ffi.new("int32_t[]", 4), ffi.new("uint64_t[]", 4)
        assert lib.qs_vocab_bpe(v, b"aaa", 3, 0, ids, ends, 2) == -1  # cap below the character count
        assert lib.qs_vocab_bpe(v, b"aaa", 3, 0, ids, ends, 3) == 3 and list(ids[0:3]) == [0, 0, 0]
        assert list(ends[0:3]) == [1, 2, 3]
        assert lib.qs_vocab_bpe(v, b"\xff", 1, lib.QS_BPE_BYTE_MAP, ids, ends, 1) == 1  # mapped to U+00FF: 2 bytes
        assert ids[0] == -1 and ends[0] == 2
        starts = ffi.new("uint64_t[]", 3)
        ends_c = ffi.new("uint64_t[]", [1, 3])
        assert lib.qs_vocab_bpe_words(v, b"a\xc3\xa9a", 4, ends_c, 2, 0, ids, 4, starts) == 3  # a | éa
        assert list(ids[0:3]) == [0, -1, 0] and list(starts[0:3]) == [0, 1, 3]
        assert lib.qs_vocab_bpe_words(v, b"a\xc3\xa9a", 4, ends_c, 2, lib.QS_BPE_BYTE_MAP, ids, 4, starts) == 4
        assert lib.qs_vocab_bpe_words(v, b"a\xc3\xa9a", 4, ends_c, 2, lib.QS_BPE_BYTE_MAP, ids, 3, starts) == -1
        assert lib.qs_vocab_bpe_words(v, b"aa", 2, ffi.new("uint64_t[]", [1, 3]), 2, 0, ids, 4, starts) == -1
        assert lib.qs_vocab_bpe_words(v, b"aa", 2, ffi.new("uint64_t[]", [2, 1]), 2, 0, ids, 4, starts) == -1
        assert lib.qs_vocab_bpe_words(v, b"a\xc3", 2, ffi.new("uint64_t[]", [2]), 1, 0, ids, 4, starts) == -1
        assert lib.qs_vocab_no_whole(v, b"\x01\x00", 2) == -1  # one flag per piece
    finally:
        lib.qs_vocab_free(v)


def test_tokenize_command_does_not_import_numpy(model_path):
    """`quantscope tokenize` starts as fast as llama-tokenize only because it never imports numpy (about 70 ms)."""
    path = model_path("smollm2")
    code = ("import sys\nfrom quantscope.cli.main import main\nrc = main(['tokenize', sys.argv[1], '--ids', "
            "'Hello, world! 123'])\nassert rc == 0, rc\nprint(sorted(m for m in sys.modules if m.split('.')[0] == "
            "'numpy'), file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "[]", res.stderr
    assert res.stdout.split() == ["19556", "28", "905", "17", "216", "33", "34", "35"]


def walk_split(text: str, exprs: tuple[str, ...]) -> list[str]:
    """The pre-tokenizer split by walking each expression's matches (the reference for regex_split's fast path)."""
    import regex

    pieces = [text]
    for expr in exprs:
        out: list[str] = []
        for piece in pieces:
            pos = 0
            for m in regex.finditer(expr, piece):
                if m.start() > pos:
                    out.append(piece[pos : m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces


def test_every_pre_tokenizer_splits_as_the_match_walk():
    from quantscope.core.tokenizer import PRE_TOKENIZERS

    rng = random.Random(3)
    docs = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))[:6000]
    alphabet = "ab Z9 0123\n\r\t  .,'s'LL—é中한Привет\u00a0\u2581!?()"
    texts = [docs, "", " ", "\n\n\n", "   leading and trailing   ", "1234567 89", "I'm ALL CAPS'LL don't"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    for name, exprs in PRE_TOKENIZERS.items():
        for t in texts:
            assert regex_split(t, exprs) == walk_split(t, exprs), (name, t)
