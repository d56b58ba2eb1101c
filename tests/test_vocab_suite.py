"""llama.cpp's tokenizer tests: every ``ggml-vocab-*.gguf`` of the llama-cpp-python sdist with its ``.inp``/``.out``
cases (``quantscope models fetch`` keeps them in the model cache; missing data fails, never skips).

Each case is tokenized as llama.cpp's test-tokenizer-0 does it: no BOS/EOS added, special tokens not parsed (but
user-defined tokens matched). Vocabularies of a tokenizer model the engine does not implement must be refused with
a message naming it; they are listed in :data:`UNSUPPORTED`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantscope.core import catalog
from quantscope.core.gguf import GGUFFile
from quantscope.core.tokenizer import Tokenizer, TokenizerError

SEP = "\n__ggml_vocab_test__\n"
#: vocabularies whose tokenizer model is not implemented: T5's Unigram (no chat architecture uses it; no cases)
UNSUPPORTED = {"nomic-bert-moe": "t5"}
#: every vocabulary with test cases in llama-cpp-python 0.3.36 (a new one must be added here, deliberately)
WITH_CASES = ("bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
              "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder")


def vocab_dir() -> Path:
    if not catalog.data_present():
        pytest.fail(f"llama.cpp's test data is missing from {catalog.data_dir()}: run `quantscope models fetch`",
                    pytrace=False)
    return catalog.data_dir() / "vocab"


def cases(path: Path) -> list[tuple[str, list[int]]]:
    """The (text, token ids) pairs, split as llama.cpp's test-tokenizer-0 splits them."""
    raw = Path(str(path) + ".inp").read_bytes().decode("utf-8")
    texts = raw.split(SEP)
    if raw.endswith(SEP):
        texts = texts[:-1]
    outs = Path(str(path) + ".out").read_text(encoding="utf-8").split("\n")
    if outs and outs[-1] == "":
        outs = outs[:-1]
    assert len(texts) == len(outs), path
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs, strict=True)]


def test_the_list_is_complete():
    found = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in vocab_dir().glob("ggml-vocab-*.gguf.inp"))
    assert tuple(found) == WITH_CASES


@pytest.mark.parametrize("name", WITH_CASES)
def test_every_case_tokenizes_as_llama_cpp(name):
    path = vocab_dir() / f"ggml-vocab-{name}.gguf"
    with GGUFFile(path) as f:
        tok = Tokenizer(f)
        failed = [(text, want, got) for text, want in cases(path)
                  if (got := tok.encode(text, add_special=False, parse_special=False)) != want]
    assert not failed, f"{len(failed)} case(s) differ, first: {failed[0]!r}"


def test_every_other_vocabulary_loads_or_is_refused_by_name():
    """The vocabularies without cases load too, except those listed, which are refused naming their model."""
    for p in sorted(vocab_dir().glob("ggml-vocab-*.gguf")):
        name = p.name[len("ggml-vocab-"):-len(".gguf")]
        with GGUFFile(p) as f:
            if name in UNSUPPORTED:
                with pytest.raises(TokenizerError, match=f"'{UNSUPPORTED[name]}' is not supported"):
                    Tokenizer(f)
            else:
                assert Tokenizer(f).encode("Hello world", add_special=False), name


def test_gemma4_specifics():
    """Gemma 4's BPE: spaces become U+2581 inside tokens, a byte the merges do not cover is a <0xXX> token, BOS
    is added even when the file says not to, and decoding restores the text."""
    with GGUFFile(vocab_dir() / "ggml-vocab-gemma-4.gguf") as f:
        tok = Tokenizer(f)
    assert tok.spm_style and tok.add_bos and tok.bos_id == 2
    text = "Hello world\n\n\tcafé  🦙 \U000f0000"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and "▁world" in tok.pieces_of(ids)
    assert tok.pieces_of(ids)[-4:] == ["<0xF3>", "<0xB0>", "<0x80>", "<0x80>"]  # a private-use character: bytes
    assert tok.decode(ids[1:]) == text
    assert tok.encode("\n\n", add_special=False) == [tok.vocab["\n\n"]]


def test_every_vocab_file_opens_in_the_explorer():
    """Vocab-only GGUFs (no tensors) are files users open too: the reader takes all of them."""
    paths = sorted(vocab_dir().glob("ggml-vocab-*.gguf"))
    assert len(paths) >= 19
    for p in paths:
        with GGUFFile(p) as f:
            assert f.metadata.get("tokenizer.ggml.model") is not None and not f.tensors, p.name


def test_tekken_tokenizes_as_llama_cpp(tmp_path):
    """Mistral's tekken pre-tokenizer (no llama.cpp vocab test has it): llama-bpe's vocabulary relabelled tekken,
    on its cases and a few where the expressions differ, against llama-tokenize's ids (tests/data/tekken.json,
    recorded by tests/record_tekken.py)."""
    import json

    from .record_tekken import tekken_vocab, texts

    recorded = json.loads((Path(__file__).parent / "data" / "tekken.json").read_text(encoding="utf-8"))["cases"]
    assert [t for t, _ in recorded] == texts()
    path = tekken_vocab(tmp_path / "tekken.gguf")
    with GGUFFile(path) as f:
        tok = Tokenizer(f)
        assert tok.pre == "tekken"
        failed = [(t, ids, got) for t, ids in recorded
                  if (got := tok.encode(t, add_special=False, parse_special=False)) != ids]
    assert not failed, f"{len(failed)} case(s) differ, first: {failed[0]!r}"


def test_the_special_token_matcher_equals_a_longest_first_alternation():
    """Special tokens are found without compiling an alternation; on random texts over a small alphabet the
    matches are those of one (leftmost, longest at a position, no overlaps)."""
    import random

    import regex

    from quantscope.core.tokenizer import _PieceMatcher

    pieces = {"<a>", "<ab>", "<abc>", "ab", "b<", "<", "c", "☃x"}
    rx = regex.compile("|".join(regex.escape(p) for p in sorted(pieces, key=len, reverse=True)))
    m = _PieceMatcher(pieces)
    rnd = random.Random(3)
    for _ in range(500):
        text = "".join(rnd.choice("<>abc☃x ") for _ in range(rnd.randint(0, 30)))
        assert list(m.finditer(text)) == [mm.span() for mm in rx.finditer(text)], text
