"""Tokenizers read from GGUF metadata: byte-level BPE (``gpt2``) with llama.cpp's pre-tokenizers, and
SentencePiece-style BPE with scores (``llama``, as gemma uses); special tokens recognised in text; streaming
detokenization that never emits half a UTF-8 character."""

from __future__ import annotations

import heapq
import itertools
import numbers
import re
import struct
import unicodedata
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from ..gguf import GGUFFile
from ..gguf.strings import StringArray
from ..native import ffi, lib

# token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's pre-tokenizer expressions, applied in sequence (each splits the pieces of the previous one).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The expressions below are data from llama.cpp's llama-vocab.cpp (themselves from each model's tokenizer.json),
# written with \u escapes.
_DEEPSEEK_LLM = (
    '[\r\n]',
    '\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+',
    '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+',
    '\\s+$',
    '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
    '\\p{N}+',
)
_DEEPSEEK_CODER = (
    '[\r\n]',
    '\\s?\\p{L}+',
    '\\s?\\p{P}+',
    '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
    '\\p{N}',
)
_FALCON = (
    '[\\p{P}\\$\\+<=>\\^~\\|`]+',
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    '[0-9][0-9][0-9]',
)
_QWEN35 = (
    (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
     r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
)
# Mistral's tekken, as llama.cpp runs it: upper-case runs are "letters other than a-z", lower-case runs "letters
# other than A-Z" (its rewrite of the tokenizer.json expression with Unicode case classes).
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
           r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
# OpenAI's o200k (gpt-oss, "gpt-4o"): upper-case-led and lower-case runs with a contraction, digits in threes; the
# case classes written as llama.cpp runs them (letters other than a-z / A-Z)
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS +
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS +
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: BPE pre-tokenizers over raw UTF-8 with spaces as U+2581 (merges run on whole lines; newline runs apart)
SPM_STYLE_BPE = ("gemma4", "granite-embed-multi-311m", "sarvam-moe")
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "gemma4": ("[^\n]+|[\n]+",),
    "granite-embed-multi-311m": ("[^\n]+|[\n]+",),
    "sarvam-moe": ("[^\n]+|[\n]+",),
    "default": (_GPT2,),
    "gpt2": (_GPT2,),
    "gpt-2": (_GPT2,),
    "phi-2": (_GPT2,),
    "mpt": (_GPT2,),
    "olmo": (_GPT2,),
    "llama-bpe": (_LLAMA3,),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "falcon3": (_LLAMA3,),
    "pixtral": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "dbrx": (_LLAMA3,),  # OLMo 2
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "stablelm2": (_QWEN2,),
    "qwen35": _QWEN35,
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-coder": _DEEPSEEK_CODER,
    "falcon": _FALCON,
    "command-r": (r"\p{N}", _GPT2),
    "tekken": (_TEKKEN,),
    "gpt-4o": (_GPT4O,),
    "minimax-m2": (_GPT4O,),
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
}


def _is_cjk(cp: int) -> bool:
    """The CJK ideograph blocks BERT splits into single characters (llama.cpp's ranges, HF's quirk included)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class TokenizerError(ValueError):
    """The file's tokenizer is missing or of a kind we do not implement."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def regex_split(text: str, exprs: Sequence[str]) -> list[str]:
    """Split like llama.cpp's unicode_regex_split: each expression splits every piece into its matches and the
    unmatched gaps between them (both kept). An expression without groups runs as one ``split`` per piece with the
    whole expression captured (about twice as fast as walking the matches; none of them matches the empty text)."""
    pieces = [text]
    for expr in exprs:
        pat = regex.compile(expr)
        out: list[str] = []
        if pat.groups == 0:
            split = regex.compile(f"({expr})").split
            for piece in pieces:
                out.extend(filter(None, split(piece)))
            pieces = out
            continue
        add = out.append
        for piece in pieces:
            pos = 0
            for m in pat.finditer(piece):
                a, b = m.span()
                if a > pos:
                    add(piece[pos:a])
                if b > a:
                    add(piece[a:b])
                pos = b
            if pos < len(piece):
                add(piece[pos:])
        pieces = out
    return pieces


class _PieceMatcher:
    """Finds a fixed set of pieces in a text, leftmost first and the longest at a position (what an alternation
    of the pieces sorted longest first matches), without compiling one: Gemma's 6,000+ control tokens took the
    ``regex`` module 0.8 s to compile and made every search slow. Candidate positions are those of the pieces'
    first characters; at each one, the pieces' lengths are tried longest first against a set."""

    def __init__(self, pieces: set[str]) -> None:
        self.pieces = pieces
        self.lengths = sorted({len(p) for p in pieces}, reverse=True)
        self.first = re.compile("[" + "".join(sorted({re.escape(p[0]) for p in pieces})) + "]")

    def finditer(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) of each match, left to right, not overlapping."""
        pos, end = 0, len(text)
        for m in self.first.finditer(text):
            i = m.start()
            if i < pos:
                continue
            for n in self.lengths:
                if i + n <= end and text[i : i + n] in self.pieces:
                    yield i, i + n
                    pos = i + n
                    break


class _Vocab(Mapping[str, int]):
    """Piece -> id (the first id of a piece that occurs twice) and the BPE merge ranks, as native hash tables over the
    string arrays' bytes (csrc/qs_vocab.c): built in milliseconds, no Python object per entry."""

    def __init__(self, pieces: StringArray, merges: StringArray | None) -> None:
        """``pieces``: a copy of the tokens' array (:meth:`StringArray.detached`), whose buffer the table indexes."""
        self._pieces = pieces
        self._tok = ffi.from_buffer(pieces.buffer)  # the table points into these buffers: kept alive with it
        mblob = merges.copy() if merges is not None else None
        self._mrg = ffi.from_buffer(mblob) if mblob is not None else ffi.NULL
        err = ffi.new("int *")
        table = lib.qs_vocab_new(self._tok, pieces.nbytes, len(pieces), self._mrg,
                                 len(mblob) if mblob is not None else 0, len(merges) if merges is not None else 0, err)
        if table == ffi.NULL:
            raise MemoryError("out of memory indexing the vocabulary") if err[0] == -2 else TokenizerError(
                "the vocabulary's string arrays changed since the file was opened")
        self._table = ffi.gc(table, lib.qs_vocab_free)
        self._dict: dict[str, int] | None = None

    def get(self, key: object, default: Any = None) -> Any:
        if not isinstance(key, str):
            return default
        b = key.encode("utf-8", "surrogatepass")
        i = lib.qs_vocab_find(self._table, b, len(b))
        return default if i < 0 else int(i)

    def __getitem__(self, key: str) -> int:
        i = self.get(key)
        if i is None:
            raise KeyError(key)
        return i

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def _all(self) -> dict[str, int]:
        if self._dict is None:
            n = len(self._pieces)
            self._dict = dict(zip(reversed(self._pieces), range(n - 1, -1, -1), strict=True))
        return self._dict

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def no_whole(self, ids: Iterable[int]) -> None:
        """Words equal to these pieces are merged, not taken whole (control tokens, as llama.cpp)."""
        flags = bytearray(len(self._pieces))
        for i in ids:
            flags[i] = 1
        if lib.qs_vocab_no_whole(self._table, ffi.from_buffer(flags), len(flags)) != 0:
            raise MemoryError("out of memory marking control tokens")

    def bpe_words(self, text: str, words: Sequence[str], byte_map: bool) -> tuple[list[int], list[int] | None]:
        """The ids of each of ``words`` (consecutive pieces of ``text``) after :meth:`bpe` with whole words first,
        back to back. A symbol that is not a piece is ``-1``: then the second item gives where each word's ids
        start (``len(words) + 1`` entries) for the caller's fallback; otherwise it is ``None``."""
        raw = text.encode("utf-8")
        ends = array("Q", itertools.accumulate(map(len, words)))
        if ends and ends[-1] != len(text):
            raise ValueError("the words do not make up the text")
        n = max(len(raw), 1)  # a word has at most as many symbols as bytes
        ids = ffi.new("int32_t[]", n)
        starts = ffi.new("uint64_t[]", len(words) + 1)
        flags = (lib.QS_BPE_BYTE_MAP if byte_map else 0) | lib.QS_BPE_WHOLE_FIRST
        k = lib.qs_vocab_bpe_words(self._table, raw, len(raw), ffi.from_buffer("uint64_t[]", ends), len(words), flags,
                                   ids, n, starts)
        if k < 0:
            raise MemoryError("out of memory merging words") if k == -2 else RuntimeError("qs_vocab_bpe_words refused")
        out = ffi.unpack(ids, k)
        return (out, None) if -1 not in out else (out, ffi.unpack(starts, len(words) + 1))

    def rank(self, left: str, right: str) -> int | None:
        """Rank of the merge ``left right`` (``None``: no such merge)."""
        a, b = left.encode("utf-8", "surrogatepass"), right.encode("utf-8", "surrogatepass")
        r = lib.qs_vocab_rank(self._table, a, len(a), b, len(b))
        return None if r < 0 else int(r)

    def bpe(self, word: bytes, byte_map: bool, whole_first: bool = False) -> tuple[list[int], list[int]]:
        """The ids (-1: not a piece) of the symbols byte-pair merging leaves of ``word`` and the byte offsets where
        they end in the (byte-mapped) word; see ``qs_vocab_bpe``."""
        n = len(word)
        ids = ffi.new("int32_t[]", max(n, 1))
        ends = ffi.new("uint64_t[]", max(n, 1))
        flags = (lib.QS_BPE_BYTE_MAP if byte_map else 0) | (lib.QS_BPE_WHOLE_FIRST if whole_first else 0)
        k = lib.qs_vocab_bpe(self._table, word, n, flags, ids, ends, n)
        if k < 0:
            raise MemoryError("out of memory merging a word") if k == -2 else RuntimeError("qs_vocab_bpe refused")
        return ffi.unpack(ids, k), ffi.unpack(ends, k)


@dataclass(frozen=True)
class Token:
    id: int
    piece: str
    type: int


class Tokenizer:
    """Encode/decode with the vocabulary, merges/scores and special tokens of a GGUF file."""

    def __init__(self, f: GGUFFile) -> None:
        """Read and validate the vocabulary: malformed required metadata raises :class:`TokenizerError` naming
        the key; a special-token id of the wrong type or out of range is treated as absent (as llama.cpp does)
        and recorded in :attr:`problems`."""
        #: metadata that was ignored (wrong type, out of range), one sentence each
        self.problems: list[str] = []
        self.model = f.get("tokenizer.ggml.model")
        if self.model is not None and not isinstance(self.model, str):
            raise TokenizerError(f"tokenizer.ggml.model is not a string ({_kind(self.model)})")
        if self.model not in ("gpt2", "gemma4", "llama", "bert"):
            raise TokenizerError(f"tokenizer model {self.model!r} is not supported (gpt2 and gemma4 BPE, llama SPM "
                                 "and bert WordPiece are)")
        #: BPE over GPT-2's byte-to-character mapping ("gpt2") or over raw UTF-8 with spaces written as U+2581
        #: and <0xXX> byte tokens for what the merges do not cover (Gemma 4's "SPM-style" BPE)
        self.bpe = self.model in ("gpt2", "gemma4")
        tokens = _string_array(f, "tokenizer.ggml.tokens")
        if tokens is None:
            raise TokenizerError("the file has no tokenizer.ggml.tokens")
        if not len(tokens):
            raise TokenizerError("tokenizer.ggml.tokens is empty")
        merges = _string_array(f, "tokenizer.ggml.merges") if self.bpe else None
        if self.bpe and merges is None:
            raise TokenizerError(f"{self.model} tokenizer without tokenizer.ggml.merges")
        #: the pieces, by id (decoded on access)
        self.pieces: Sequence[str] = tokens.detached()
        n = len(self.pieces)
        types = _int_array(f, "tokenizer.ggml.token_type", n)
        #: token types (``NORMAL``, ``CONTROL``, ...), by id
        self.types: array[int] = types if types is not None else array("i", [NORMAL]) * n
        #: piece -> id (the first id of a piece that occurs twice) and the merge ranks
        self.vocab = _Vocab(self.pieces, merges)  # type: ignore[arg-type]
        pre = f.get("tokenizer.ggml.pre", "default")
        if not isinstance(pre, str):
            raise TokenizerError(f"tokenizer.ggml.pre is not a string ({_kind(pre)})")
        self.pre = "gemma4" if self.model == "gemma4" else pre  # llama.cpp sets it for this model
        self.bos_id = self._special_id(f, "tokenizer.ggml.bos_token_id", n)
        self.eos_id = self._special_id(f, "tokenizer.ggml.eos_token_id", n)
        self.eot_id = self._special_id(f, "tokenizer.ggml.eot_token_id", n)
        self.unk_id = self._special_id(f, "tokenizer.ggml.unknown_token_id", n)
        self.sep_id = self._special_id(f, "tokenizer.ggml.seperator_token_id", n)  # (sic: ggml's key)
        if self.model == "bert":  # llama.cpp's defaults for BERT vocabularies
            self.bos_id = 101 if self.bos_id is None and n > 101 else self.bos_id
            self.unk_id = 100 if self.unk_id is None and n > 100 else self.unk_id
            self.sep_id = 102 if self.sep_id is None and n > 102 else self.sep_id
        # as llama.cpp defaults
        default_bos = self.model in ("llama", "bert") or f.get("tokenizer.ggml.pre") == "tekken"
        self.add_bos = self._flag(f, "tokenizer.ggml.add_bos_token", default_bos)
        if self.pre in SPM_STYLE_BPE:  # llama.cpp overrides a false add_bos_token for Gemma 4
            self.add_bos = True
        self.add_eos = self._flag(f, "tokenizer.ggml.add_eos_token", False)
        self.add_space_prefix = self._flag(f, "tokenizer.ggml.add_space_prefix", self.model == "llama")
        self.add_sep = self._flag(f, "tokenizer.ggml.add_sep_token", self.model == "bert")
        # BERT's normalizer (llama.cpp: lowercase by default, accents stripped when lowercasing unless told)
        self.lowercase = self._flag(f, "tokenizer.ggml.normalizer.lowercase", True)
        self.strip_accents = self._flag(f, "tokenizer.ggml.normalizer.strip_accents", self.lowercase)
        if self.problems:
            import logging

            for p in self.problems:
                logging.getLogger(__name__).warning("tokenizer: %s", p)
        self.special_ids = _ids_of_types(self.types, (CONTROL, USER_DEFINED))
        self._special_re = self._alternation(self.special_ids)
        # user-defined tokens (MPT's runs of spaces, ...) are matched in the text even when special tokens are not
        # parsed, as llama.cpp does
        self._user_re = self._alternation([i for i in self.special_ids if self.types[i] == USER_DEFINED])
        self._cache: dict[str, list[int]] = {}
        if self.bpe:
            if self.pre not in PRE_TOKENIZERS:
                raise TokenizerError(f"pre-tokenizer {self.pre!r} is not supported "
                                     f"(known: {', '.join(sorted(PRE_TOKENIZERS))})")
            self.exprs = PRE_TOKENIZERS[self.pre]
            self.vocab.no_whole(_ids_of_types(self.types, (CONTROL,)))
            self.spm_style = self.pre in SPM_STYLE_BPE
            self.byte_enc = bytes_to_unicode()
            self.byte_dec = {c: b for b, c in self.byte_enc.items()}
            self.byte_ids = self._byte_ids() if self.spm_style else {}
        elif self.model == "bert":
            self.max_piece = max((len(p) for p in self.pieces), default=1)
        else:
            scores = _num_array(f, "tokenizer.ggml.scores", n)
            self.scores: array[float] = scores if scores is not None else array("f", bytes(4 * n))
            self.byte_ids = self._byte_ids()

    def _byte_ids(self) -> dict[int, int]:
        """Byte value -> id of its <0xXX> byte token (the first one)."""
        out: dict[int, int] = {}
        for i in _ids_of_types(self.types, (BYTE,)):
            b = _byte_value(self.pieces[i])
            if b is not None:
                out.setdefault(b, i)
        return out

    def _alternation(self, ids: list[int]) -> _PieceMatcher | None:
        """A matcher of the pieces of ``ids`` (``None`` for no pieces)."""
        pieces = {self.pieces[i] for i in ids if self.pieces[i]}
        return _PieceMatcher(pieces) if pieces else None

    def _special_id(self, f: GGUFFile, key: str, n: int) -> int | None:
        """A special token id, or ``None`` when absent, not an integer or not in ``0..n-1`` (noted)."""
        v = f.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            self.problems.append(f"{key} is not an integer ({_kind(v)}); ignored")
            return None
        if not 0 <= int(v) < n:
            self.problems.append(f"{key} = {int(v)} is outside the vocabulary (0..{n - 1}); ignored")
            return None
        return int(v)

    def _flag(self, f: GGUFFile, key: str, default: bool) -> bool:
        v = f.get(key)
        if v is None:
            return default
        if isinstance(v, (bool, numbers.Integral)):
            return bool(v)
        self.problems.append(f"{key} is not a boolean ({_kind(v)}); the default {default} is used")
        return default

    # ------------------------------------------------------------------ properties
    @property
    def n_vocab(self) -> int:
        return len(self.pieces)

    def is_eog(self, tid: int) -> bool:
        """End-of-generation token (eos, eot, or a control token named like an end marker)."""
        if tid in (self.eos_id, self.eot_id):
            return True
        if 0 <= tid < self.n_vocab and self.types[tid] == CONTROL:
            return self.pieces[tid] in ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")
        return False

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, add_special: bool | None = None, parse_special: bool = True,
               literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token ids of ``text``; BOS/EOS per metadata unless ``add_special`` says otherwise; special tokens
        written in the text are recognised when ``parse_special``, except control tokens that overlap a
        ``literal`` span (``(start, end)`` character offsets, in order): those are text (a chat's contents)."""
        add = (self.add_bos or self.add_eos) if add_special is None else add_special
        ids: list[int] = []
        if add and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        first = True
        for is_special, chunk in self._split_special(text, parse_special, literal):
            if is_special:
                ids.append(self.vocab[chunk])
                continue
            if self.bpe:
                ids.extend(self._encode_bpe(chunk))
            elif self.model == "bert":
                ids.extend(self._encode_wpm(chunk))
            else:
                if self.add_space_prefix and first:
                    chunk = " " + chunk
                ids.extend(self._encode_spm(chunk))
            first = False
        if add and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        if add and self.add_sep and self.sep_id is not None:
            ids.append(self.sep_id)
        return ids

    def _wpm_words(self, text: str) -> list[str]:
        """BERT's pre-tokenization as llama.cpp does it: NFD and accent marks dropped when stripping accents,
        control characters dropped, lower case, whitespace separates words, punctuation, ASCII symbols and CJK
        ideographs are words of their own."""
        if self.strip_accents:
            text = unicodedata.normalize("NFD", text)
        words: list[str] = []
        cur: list[str] = []
        for ch in text:
            if ch.isspace():
                if cur:
                    words.append("".join(cur))
                    cur = []
                continue
            cat = unicodedata.category(ch)
            if ch in ("\x00", "\ufffd") or cat[0] == "C" or (self.strip_accents and cat[0] == "M"):
                continue
            if self.lowercase:
                low = ch.lower()
                ch = low if len(low) == 1 else ch
            cp = ord(ch)
            if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_cjk(cp):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(ch)
            else:
                cur.append(ch)
        if cur:
            words.append("".join(cur))
        return words

    def _encode_wpm(self, text: str) -> list[int]:
        """Greedy longest match over each word with the word-start marker; a word with an unmatched position
        becomes the unknown token."""
        out: list[int] = []
        for word in self._wpm_words(text):
            w = "\u2581" + word
            start = len(out)
            i = 0
            while i < len(w):
                for j in range(min(len(w), i + self.max_piece), i, -1):
                    tid = self.vocab.get(w[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:
                    del out[start:]
                    break
            if len(out) == start and self.unk_id is not None:
                out.append(self.unk_id)
        return out

    def control_spans(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` of each control token's text in ``text`` (what ``parse_special`` adds to what is
        always matched), left to right."""
        if self._special_re is None:
            return []
        return [(a, b) for a, b in self._special_re.finditer(text) if self.types[self.vocab[text[a:b]]] == CONTROL]

    def _split_special(self, text: str, parse_special: bool,
                       literal: Sequence[tuple[int, int]] = ()) -> Iterable[tuple[bool, str]]:
        rx = self._special_re if parse_special else self._user_re
        if rx is None:
            if text:
                yield False, text
            return
        pos = 0
        lit = iter(literal)
        span = next(lit, None)
        for a, b in rx.finditer(text):
            while span is not None and span[1] <= a:
                span = next(lit, None)
            if span is not None and span[0] < b and self.types[self.vocab[text[a:b]]] == CONTROL:
                continue  # a control token's text inside a literal span: text
            if a > pos:
                yield False, text[pos:a]
            yield True, text[a:b]
            pos = b
        if pos < len(text):
            yield False, text[pos:]

    def _encode_bpe(self, text: str) -> list[int]:
        if not self.spm_style:  # every word in one native call
            words = regex_split(text, self.exprs)
            ids, starts = self.vocab.bpe_words(text, words, byte_map=True)
            if starts is None:
                return ids
            out: list[int] = []
            for w, word in enumerate(words):
                seg = ids[starts[w] : starts[w + 1]]
                out.extend(self._bpe(word.encode("utf-8")) if -1 in seg else seg)
            return out
        out = []
        for word in regex_split(text.replace(" ", "▁"), self.exprs):
            cached = self._cache.get(word)
            if cached is None:
                if word.strip("\n") == "" and word in self.vocab:  # a run of newlines is one token (llama.cpp)
                    cached = [self.vocab[word]]
                else:
                    cached = self._bpe(word.encode("utf-8", "surrogatepass"))
                if len(self._cache) < 100_000:
                    self._cache[word] = cached
            out.extend(cached)
        return out

    def _bpe(self, raw: bytes) -> list[int]:
        """Byte-pair merge one pre-tokenized word (natively, ``qs_vocab_bpe``; over GPT-2's byte characters unless
        SPM-style), then its symbols' ids. A byte-level word that is a piece (not a control token) is that piece; a
        symbol that is not a piece falls back to its bytes' <0xXX> tokens (SPM-style) or its characters."""
        mapped = not self.spm_style
        ids, ends = self.vocab.bpe(raw, mapped, whole_first=mapped)  # (control tokens are never taken whole)
        if -1 not in ids:
            return ids
        text = "".join(self.byte_enc[b] for b in raw).encode("utf-8") if mapped else raw
        out: list[int] = []
        start = 0
        for tid, end in zip(ids, ends, strict=True):
            if tid >= 0:
                out.append(tid)
            elif self.spm_style:  # its bytes as <0xXX> tokens (a byte without one is dropped, as in llama.cpp)
                out.extend(self.byte_ids[b] for b in text[start:end] if b in self.byte_ids)
            else:  # not in vocab: fall back to single characters
                p = text[start:end].decode("utf-8", "surrogatepass")
                out.extend(self.vocab.get(ch, self.unk_id if self.unk_id is not None else 0) for ch in p)
            start = end
        return out

    def _encode_spm(self, text: str) -> list[int]:
        text = text.replace(" ", "▁")
        syms = list(text)
        if not syms:
            return []
        n = len(syms)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        alive = [True] * n
        heap: list[tuple[float, int, int, str]] = []

        def push(i: int) -> None:
            j = nxt[i]
            if j == -1:
                return
            merged = syms[i] + syms[j]
            tid = self.vocab.get(merged)
            if tid is not None:
                heapq.heappush(heap, (-float(self.scores[tid]), i, j, merged))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, j, merged = heapq.heappop(heap)
            if not alive[i] or not alive[j] or nxt[i] != j or syms[i] + syms[j] != merged:
                continue
            syms[i] = merged
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] != -1:
                prev[nxt[j]] = i
            if prev[i] != -1:
                push(prev[i])
            push(i)
        ids: list[int] = []
        i = 0
        while i != -1:
            s = syms[i]
            tid = self.vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:
                for b in s.encode("utf-8"):
                    ids.append(self.byte_ids.get(b, self.unk_id if self.unk_id is not None else 0))
            i = nxt[i]
        return ids

    # ------------------------------------------------------------------ decoding
    def token_bytes(self, tid: int, special: bool = True) -> bytes:
        """The bytes token ``tid`` stands for (control tokens render as their text when ``special``)."""
        if not 0 <= tid < len(self.pieces):
            return b""  # an id of an embedding row with no vocabulary entry
        p = self.pieces[tid]
        t = self.types[tid]
        if t in (CONTROL, UNKNOWN, UNUSED) or (t == USER_DEFINED and self.bpe and p in self.vocab
                                              and tid in self.special_ids):
            return p.encode("utf-8") if special and t != UNUSED else b""
        if self.model == "gpt2":
            try:
                return bytes(self.byte_dec[c] for c in p)
            except KeyError:
                return p.encode("utf-8")
        if t == BYTE:
            b = _byte_value(p)
            if b is not None:
                return bytes([b])
        return p.replace("▁", " ").encode("utf-8")

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        data = b"".join(self.token_bytes(i, special) for i in ids)
        text = data.decode("utf-8", errors="replace")
        if self.model == "llama" and self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def pieces_of(self, ids: Iterable[int]) -> list[str]:
        return [self.pieces[i] for i in ids]


def _kind(v: object) -> str:
    """A short description of a metadata value's type, for messages."""
    if isinstance(v, str):
        return f"a string ({v[:20]!r})"
    if isinstance(v, (StringArray, list)) or hasattr(v, "ndim"):
        return f"an array of {len(v)}"  # type: ignore[arg-type]
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return f"a boolean ({bool(v)})"
    if isinstance(v, numbers.Real):
        return f"{'an integer' if isinstance(v, numbers.Integral) else 'a float'} ({v})"
    return type(v).__name__


def _string_array(f: GGUFFile, key: str) -> StringArray | None:
    v = f.get(key)
    if v is None:
        return None
    if not isinstance(v, StringArray):
        raise TokenizerError(f"{key} is not an array of strings ({_kind(v)})")
    return v


def _numbers(f: GGUFFile, key: str, n: int, floats: bool) -> array[Any] | None:
    """A numeric metadata array of ``n`` entries (integers only unless ``floats``), read without numpy."""
    kv = f.metadata.get(key)
    if kv is None:
        return None
    v = kv.numbers()
    if v is None or (kv.elem_type is not None and kv.elem_type.name == "BOOL") or (not floats and v.typecode in "fd"):
        raise TokenizerError(f"{key} is not a numeric array ({_kind(kv.value)})")
    if len(v) != n:
        raise TokenizerError(f"{key} has {len(v)} entries but tokenizer.ggml.tokens has {n}")
    return v


def _int_array(f: GGUFFile, key: str, n: int) -> array[int] | None:
    """Integers clipped to int32, as llama.cpp reads them."""
    v = _numbers(f, key, n, floats=False)
    if v is None or v.typecode in "bBhHi":
        return v if v is None or v.typecode == "i" else array("i", v)
    lo, hi = -(2**31), 2**31 - 1
    return array("i", (lo if x < lo else hi if x > hi else x for x in v))


def _num_array(f: GGUFFile, key: str, n: int) -> array[float] | None:
    """Numbers as float32 (out-of-range float64 values become infinities, as a cast does)."""
    v = _numbers(f, key, n, floats=True)
    if v is None or v.typecode == "f":
        return v
    big = 3.4028234663852886e38
    return array("f", (x if -big <= x <= big or x != x else (float("inf") if x > 0 else float("-inf")) for x in v))


def _ids_of_types(types: array[int], wanted: tuple[int, ...]) -> list[int]:
    """Ids whose type is one of ``wanted``, in order (a byte search over the int32 array: vocabularies are mostly
    NORMAL, so this is far faster than a Python loop over 150k entries)."""
    raw = types.tobytes()
    out: list[int] = []
    for t in wanted:
        pat = struct.pack("=i", t)
        i = raw.find(pat)
        while i != -1:
            if i % 4 == 0:
                out.append(i // 4)
                i = raw.find(pat, i + 4)
            else:
                i = raw.find(pat, i + 1)
    return sorted(out)


def _byte_value(piece: str) -> int | None:
    """The byte a ``<0xAB>`` piece stands for, or ``None`` when it is not one (``<0xZZ>``: a normal piece)."""
    if len(piece) != 6 or not piece.startswith("<0x") or not piece.endswith(">"):
        return None
    hx = piece[3:5]
    return int(hx, 16) if all(c in "0123456789abcdefABCDEF" for c in hx) else None


class StreamDecoder:
    """Turns a stream of token ids into text deltas, holding back incomplete UTF-8 sequences."""

    def __init__(self, tok: Tokenizer, special: bool = False) -> None:
        self.tok = tok
        self.special = special
        self.buf = b""

    def push(self, tid: int) -> str:
        self.buf += self.tok.token_bytes(tid, self.special)
        cut = _valid_prefix(self.buf)
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out.decode("utf-8", errors="replace")

    def flush(self) -> str:
        out, self.buf = self.buf, b""
        return out.decode("utf-8", errors="replace")


def _valid_prefix(b: bytes) -> int:
    """Length of the longest prefix of ``b`` that does not end inside a UTF-8 sequence."""
    n = len(b)
    i = n - 1
    back = 0
    while i >= 0 and back < 4 and (b[i] & 0xC0) == 0x80:
        i -= 1
        back += 1
    if i < 0:
        return n
    lead = b[i]
    if lead >> 5 == 0b110:
        need = 2
    elif lead >> 4 == 0b1110:
        need = 3
    elif lead >> 3 == 0b11110:
        need = 4
    else:
        need = 1
    return n if n - i >= need else i
