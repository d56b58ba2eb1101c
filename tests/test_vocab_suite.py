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
#: vocabularies with test cases whose tokenizer model is not implemented (Gemma 4's)
UNSUPPORTED = {"gemma-4": "gemma4"}
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


@pytest.mark.parametrize("name", [n for n in WITH_CASES if n not in UNSUPPORTED])
def test_every_case_tokenizes_as_llama_cpp(name):
    path = vocab_dir() / f"ggml-vocab-{name}.gguf"
    with GGUFFile(path) as f:
        tok = Tokenizer(f)
        failed = [(text, want, got) for text, want in cases(path)
                  if (got := tok.encode(text, add_special=False, parse_special=False)) != want]
    assert not failed, f"{len(failed)} case(s) differ, first: {failed[0]!r}"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_tokenizers_are_refused_by_name(name):
    with GGUFFile(vocab_dir() / f"ggml-vocab-{name}.gguf") as f, \
            pytest.raises(TokenizerError, match=f"'{UNSUPPORTED[name]}' is not supported"):
        Tokenizer(f)


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
