"""Edit a GGUF file's metadata and save the result (docs/edit.md).

The edit model is pure data: an :class:`EditList` holds edit operations (:class:`SetValue`, :class:`AddKey`,
:class:`DeleteKey`, :class:`SetArrayElement`, :class:`SetChatTemplate`, :class:`SetSpecialToken`) and a cursor;
undo and redo only move the cursor. The effective metadata (:class:`MetadataState`) is always recomputed from the
file's original metadata plus the operations before the cursor, and every operation is validated against the state
it applies to, so an edit list that was accepted always replays.

:func:`save_edited` writes the result through :class:`~quantscope.core.fsutil.OutputSet` (a temporary in the target
folder, synced and renamed into place; a cancelled or failed write leaves nothing): header, the edited metadata,
the tensor infos, padding, then every tensor's bytes copied unchanged (in the kernel where the OS can:
:func:`~quantscope.core.fsutil.copy_file_range`). For the edits gguf-py's ``gguf_new_metadata.py`` can make, the
output is the same bytes as that script's.
"""

from __future__ import annotations

import bisect
import errno
import math
import numbers
import os
import re
import struct
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import fsutil
from ..base.gguf_constants import DEFAULT_ALIGNMENT, MAX_ARRAY_ELEMENTS, MAX_STRING_BYTES, STRUCT_CODES, ValueType
from ..fsutil import OutputSet, open_input, printable
from ..jobs import CancelFlag, Cancelled, Progress, check_cancel
from ..shardnames import sibling_shards
from .reader import GGUFFile, MetadataValue, TensorInfo
from .strings import StringArray
from .writer import ALIGNMENT_KEY, ArrayPatch, DataSection, GGUFHeader, encode_string, encode_typed, itemsize_ok, pad_to

#: The GGUF version every edited file is written as (gguf-py's and llama.cpp's writers write 3 too).
OUTPUT_VERSION = 3
#: Longest metadata key (the GGUF specification's limit).
MAX_KEY_BYTES = 65535
#: Largest ``general.alignment`` an edit may set (each tensor is padded to it).
MAX_ALIGNMENT = 1 << 24
#: Tensor bytes are copied (and cancel/progress checked) in pieces of this size.
COPY_CHUNK = 64 << 20

ARCHITECTURE_KEY = "general.architecture"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
TOKENS_KEY = "tokenizer.ggml.tokens"
#: llama-gguf-split's keys: they describe the set of files a model is split into, which an edit does not change.
SPLIT_KEYS = frozenset({"split.no", "split.count", "split.tensors.count"})

_T = ValueType
#: Special-token names (as gguf_new_metadata.py spells them, plus short aliases) and the keys llama.cpp reads. The
#: keys' spellings are llama.cpp's, ``seperator`` included.
SPECIAL_TOKENS: dict[str, str] = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unknown": "tokenizer.ggml.unknown_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "seperator": "tokenizer.ggml.seperator_token_id",
    "separator": "tokenizer.ggml.seperator_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "padding": "tokenizer.ggml.padding_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "cls": "tokenizer.ggml.cls_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
    "prefix": "tokenizer.ggml.prefix_token_id",
    "suffix": "tokenizer.ggml.suffix_token_id",
    "middle": "tokenizer.ggml.middle_token_id",
}
_SPECIAL_KEYS = frozenset(SPECIAL_TOKENS.values())

_GENERAL_STRINGS = (
    "name", "description", "author", "version", "organization", "finetune", "basename", "quantized_by",
    "size_label", "license", "license.name", "license.link", "url", "doi", "uuid", "repo_url", "source.url",
    "source.doi", "source.uuid", "source.repo_url", "type",
)
#: Keys llama.cpp reads with exactly this type (``(type, element type)``): an edit may give them only this type, or
#: the type they already have in the file. ``--set`` on a new key takes its type from here.
KNOWN_TYPES: dict[str, tuple[ValueType, ValueType | None]] = {
    ARCHITECTURE_KEY: (_T.STRING, None),
    ALIGNMENT_KEY: (_T.UINT32, None),
    "general.file_type": (_T.UINT32, None),
    "general.quantization_version": (_T.UINT32, None),
    **{f"general.{k}": (_T.STRING, None) for k in _GENERAL_STRINGS},
    "tokenizer.ggml.model": (_T.STRING, None),
    "tokenizer.ggml.pre": (_T.STRING, None),
    TOKENS_KEY: (_T.ARRAY, _T.STRING),
    "tokenizer.ggml.merges": (_T.ARRAY, _T.STRING),
    "tokenizer.ggml.scores": (_T.ARRAY, _T.FLOAT32),
    "tokenizer.ggml.token_type": (_T.ARRAY, _T.INT32),
    "tokenizer.ggml.add_bos_token": (_T.BOOL, None),
    "tokenizer.ggml.add_eos_token": (_T.BOOL, None),
    "tokenizer.ggml.add_sep_token": (_T.BOOL, None),
    "tokenizer.ggml.add_space_prefix": (_T.BOOL, None),
    "tokenizer.ggml.remove_extra_whitespaces": (_T.BOOL, None),
    CHAT_TEMPLATE_KEY: (_T.STRING, None),
    **{k: (_T.UINT32, None) for k in _SPECIAL_KEYS},
}
#: ``{arch}.SUFFIX`` keys whose type ``--set`` infers when they are new (not enforced: some may be per-layer arrays).
ARCH_KEY_TYPES: dict[str, ValueType] = {
    **{s: _T.UINT32 for s in (
        "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size", "expert_count",
        "expert_used_count", "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "attention.sliding_window", "rope.dimension_count")},
    **{s: _T.FLOAT32 for s in (
        "rope.freq_base", "rope.scaling.factor", "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon",
        "logit_scale")},
}

_INT_RANGES: dict[ValueType, tuple[int, int]] = {
    _T.UINT8: (0, 0xFF), _T.INT8: (-0x80, 0x7F), _T.UINT16: (0, 0xFFFF), _T.INT16: (-0x8000, 0x7FFF),
    _T.UINT32: (0, 0xFFFFFFFF), _T.INT32: (-0x80000000, 0x7FFFFFFF), _T.UINT64: (0, (1 << 64) - 1),
    _T.INT64: (-(1 << 63), (1 << 63) - 1),
}
_FMT = STRUCT_CODES
_FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
_INT_TEXT = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|[0-9]+)\Z")


class EditError(ValueError):
    """An edit that cannot be made (the message says why and, where it helps, what to do instead)."""


class EditCancelled(Cancelled):
    """:func:`save_edited` was cancelled; nothing was written at the target path."""


def _show(text: str, limit: int = 80) -> str:
    """A key or value for a message: control characters escaped, long text cut."""
    s = printable(text)
    return s if len(s) <= limit else s[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------------------- values
def _scalar(vtype: ValueType, v: Any, what: str) -> Any:
    """``v`` checked and normalised for one value of type ``vtype`` (not ARRAY)."""
    if vtype in _INT_RANGES:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise EditError(f"{what}: {vtype.name} needs an integer, not {type(v).__name__} {_show(repr(v))}")
        v = int(v)
        lo, hi = _INT_RANGES[vtype]
        if not lo <= v <= hi:
            raise EditError(f"{what}: {v} is out of range for {vtype.name} ({lo}..{hi})")
        return v
    if vtype in (_T.FLOAT32, _T.FLOAT64):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise EditError(f"{what}: {vtype.name} needs a number, not {type(v).__name__} {_show(repr(v))}")
        try:
            v = float(v)
        except OverflowError:  # an int beyond float64
            raise EditError(f"{what}: {v} is out of range for {vtype.name}") from None
        if not math.isfinite(v):
            raise EditError(f"{what}: {v} is not a finite number (NaN and infinities are refused)")
        if vtype == _T.FLOAT32:
            if abs(v) > _FLT_MAX:
                raise EditError(f"{what}: {v:g} is out of range for FLOAT32 (|x| <= {_FLT_MAX:g})")
            v = struct.unpack("<f", struct.pack("<f", v))[0]  # the value that will be stored
        return v
    if vtype == _T.BOOL:
        if type(v).__name__ not in ("bool", "bool_"):
            raise EditError(f"{what}: BOOL needs true or false, not {type(v).__name__} {_show(repr(v))}")
        return bool(v)
    if vtype == _T.STRING:
        if not isinstance(v, str):
            raise EditError(f"{what}: STRING needs text, not {type(v).__name__}")
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError:
            raise EditError(f"{what}: the text is not valid Unicode (a lone surrogate); it cannot be UTF-8") from None
        if n > MAX_STRING_BYTES:
            raise EditError(f"{what}: the text is {n:,} bytes; at most {MAX_STRING_BYTES:,}")
        return v
    raise EditError(f"{what}: {vtype.name} is not a scalar type")


def _stored_array(elem_type: ValueType, base: Any) -> bool:
    """Whether ``base`` is an array as the reader returns it (a :class:`StringArray`, or the ``array.array`` copy of
    a numeric one), so its elements need no check."""
    if isinstance(base, StringArray):
        return elem_type == _T.STRING
    if isinstance(base, array) and base.typecode == _FMT.get(elem_type) and itemsize_ok(base):
        return elem_type != _T.BOOL or max(base, default=0) <= 1
    return False


def _array(elem_type: ValueType, seq: Any, what: str) -> Sequence[Any]:
    if elem_type == _T.ARRAY:
        raise EditError(f"{what}: arrays of arrays cannot be written (llama.cpp refuses them)")
    if isinstance(seq, (str, bytes, bytearray, memoryview)) or not (
            isinstance(seq, Sequence) or hasattr(seq, "tolist") or isinstance(seq, array)):
        raise EditError(f"{what}: an ARRAY value must be a list of {elem_type.name} values, not {type(seq).__name__}")
    if len(seq) > MAX_ARRAY_ELEMENTS:
        raise EditError(f"{what}: {len(seq):,} elements; at most {MAX_ARRAY_ELEMENTS:,}")
    if isinstance(seq, StringArray):
        if elem_type != _T.STRING:
            raise EditError(f"{what}: a string array cannot be ARRAY[{elem_type.name}]")
        return seq  # validated by the reader
    if isinstance(seq, ArrayPatch):
        base = seq.base if _stored_array(elem_type, seq.base) else _array(elem_type, seq.base, what)
        n = len(base)
        patches = {}
        for i, v in seq.patches.items():
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < n:
                raise EditError(f"{what}: element index {i!r} is out of range for {n:,} elements")
            patches[int(i)] = _scalar(elem_type, v, f"{what}[{i}]")
        return ArrayPatch(base, patches)
    if hasattr(seq, "tolist") and not isinstance(seq, array):  # numpy
        seq = seq.tolist()
        if not isinstance(seq, list):
            raise EditError(f"{what}: an ARRAY value must be one-dimensional")
    return tuple(_scalar(elem_type, x, f"{what}[{i}]") for i, x in enumerate(seq))


@dataclass(frozen=True, eq=False)
class TypedValue:
    """A metadata value with its GGUF type, checked on construction (integer ranges, finite floats, UTF-8 text,
    flat arrays). ``value``: ``int``/``float``/``bool``/``str``, or for ARRAY a sequence of elements."""

    type: ValueType
    value: Any
    elem_type: ValueType | None = None

    def __post_init__(self) -> None:
        try:
            vtype = ValueType(self.type)
        except ValueError:
            raise EditError(f"unknown value type {self.type!r}") from None
        object.__setattr__(self, "type", vtype)
        if vtype == _T.ARRAY:
            if self.elem_type is None:
                raise EditError("an ARRAY value needs an element type")
            try:
                et = ValueType(self.elem_type)
            except ValueError:
                raise EditError(f"unknown array element type {self.elem_type!r}") from None
            object.__setattr__(self, "elem_type", et)
            object.__setattr__(self, "value", _array(et, self.value, "array"))
        else:
            if self.elem_type is not None:
                raise EditError(f"a {vtype.name} value has no element type")
            object.__setattr__(self, "value", _scalar(vtype, self.value, "value"))

    @property
    def type_label(self) -> str:
        """``UINT32``, ``ARRAY[STRING]``..."""
        return f"ARRAY[{self.elem_type.name}]" if self.type == _T.ARRAY and self.elem_type else self.type.name

    def encode(self) -> bytes:
        """The value as stored after the key: type id, then the value."""
        return encode_typed(self.type, self.value, self.elem_type)


def encode_entry(key: str, value: TypedValue) -> bytes:
    """One metadata entry (key, type, value) as it is written."""
    return encode_string(key.encode("utf-8")) + value.encode()


def type_label(vtype: ValueType, elem_type: ValueType | None = None) -> str:
    """``UINT32``, ``ARRAY[STRING]``..."""
    return f"ARRAY[{elem_type.name}]" if vtype == _T.ARRAY and elem_type is not None else vtype.name


# ------------------------------------------------------------------------------------------------------ parsing text
def parse_type(text: str) -> tuple[ValueType, ValueType | None]:
    """``UINT32`` / ``ARRAY[STRING]`` (any case) -> ``(type, element type)``."""
    t = text.strip().upper()
    elem: ValueType | None = None
    if t.startswith("ARRAY[") and t.endswith("]"):
        inner = t[6:-1].strip()
        if inner not in ValueType.__members__ or inner == "ARRAY":
            raise EditError(f"unknown array element type {_show(text)!r} (e.g. ARRAY[STRING], ARRAY[INT32])")
        return _T.ARRAY, ValueType[inner]
    if t == "ARRAY":
        raise EditError("ARRAY needs its element type: ARRAY[STRING], ARRAY[FLOAT32], …")
    if t not in ValueType.__members__:
        names = ", ".join(n for n in ValueType.__members__ if n != "ARRAY")
        raise EditError(f"unknown value type {_show(text)!r} (one of {names}, ARRAY[T])")
    return ValueType[t], elem


def _parse_scalar_text(vtype: ValueType, text: str, what: str) -> Any:
    if vtype == _T.STRING:
        return text
    s = text.strip()
    if vtype == _T.BOOL:
        low = s.lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise EditError(f"{what}: {_show(text)!r} is not a BOOL (true, false, 1 or 0)")
    if vtype in _INT_RANGES:
        m = _INT_TEXT.match(s)
        if m is None:
            raise EditError(f"{what}: {_show(text)!r} is not an integer (decimal or 0x hex)")
        if len(m.group(2)) > 24:  # before int(): Python refuses over 4,300 digits with a ValueError of its own
            raise EditError(f"{what}: an integer of {len(m.group(2)):,} digits is out of range for "
                            f"{vtype.name}")
        v = int(m.group(2), 16) if m.group(2)[:2].lower() == "0x" else int(m.group(2), 10)
        return -v if m.group(1) == "-" else v
    try:
        return float(s)
    except ValueError:
        raise EditError(f"{what}: {_show(text)!r} is not a number") from None


def parse_value(text: str, vtype: ValueType, elem_type: ValueType | None = None, what: str = "value") -> TypedValue:
    """A :class:`TypedValue` from command-line text: scalars as written (BOOL: true/false/1/0; integers in decimal
    or 0x hex), STRING verbatim, ARRAY as a JSON list (``["a", "b"]``, ``[1, 2]``)."""
    if vtype != _T.ARRAY:
        return TypedValue(vtype, _scalar(vtype, _parse_scalar_text(vtype, text, what), what))
    import json

    try:
        items = json.loads(text)
    except ValueError as exc:  # a 5,000-digit number too (Python's integer-string limit)
        raise EditError(f"{what}: an ARRAY value is a JSON list ({' '.join(str(exc).split())[:160]})") from None
    except RecursionError:
        raise EditError(f"{what}: an ARRAY value is a flat JSON list; this one is nested too deeply") from None
    if not isinstance(items, list):
        raise EditError(f"{what}: an ARRAY value is a JSON list, e.g. [1, 2] or [\"a\", \"b\"]")
    if elem_type is None:
        raise EditError(f"{what}: an ARRAY value needs an element type")
    return TypedValue(_T.ARRAY, _array(elem_type, items, what), elem_type)


def known_type(key: str, architecture: str | None = None) -> tuple[ValueType, ValueType | None] | None:
    """The type llama.cpp reads ``key`` with, when Quantscope knows it (used to type a new key set from text)."""
    if key in KNOWN_TYPES:
        return KNOWN_TYPES[key]
    if architecture and key.startswith(architecture + "."):
        t = ARCH_KEY_TYPES.get(key[len(architecture) + 1 :])
        if t is not None:
            return t, None
    return None


def check_key(key: Any) -> str:
    """Refuse a key that cannot be created: empty, not text, over 65535 bytes, with control or format characters,
    leading or trailing space, or in gguf-py's reserved ``GGUF.`` namespace. Returns it."""
    if not isinstance(key, str) or not key:
        raise EditError("a metadata key must be a non-empty text")
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise EditError(f"key {_show(key)!r} is not valid Unicode text") from None
    if n > MAX_KEY_BYTES:
        raise EditError(f"key {_show(key, 40)!r} is {n:,} bytes long; at most {MAX_KEY_BYTES:,}")
    if not key.isprintable():
        raise EditError(f"key {_show(key)!r} contains a control or invisible formatting character")
    if key != key.strip():
        raise EditError(f"key {_show(key)!r} starts or ends with white space")
    if key.startswith("GGUF."):
        raise EditError(f"key {_show(key)!r}: keys starting with GGUF. are gguf-py's virtual header fields "
                        "(its tools hide and drop them)")
    return key


# ------------------------------------------------------------------------------------------------------- operations
@dataclass(frozen=True, eq=False)
class SetValue:
    """Set ``key`` to ``value`` (any type, arrays included); adds the key when it does not exist."""

    key: str
    value: TypedValue

    def describe(self) -> str:
        return f"set {_show(self.key)} ({self.value.type_label})"


@dataclass(frozen=True, eq=False)
class AddKey:
    """Add a new key; refused when it exists."""

    key: str
    value: TypedValue

    def describe(self) -> str:
        return f"add {_show(self.key)} ({self.value.type_label})"


@dataclass(frozen=True)
class DeleteKey:
    """Delete a key; refused when it does not exist (and for ``general.architecture``)."""

    key: str

    def describe(self) -> str:
        return f"delete {_show(self.key)}"


@dataclass(frozen=True, eq=False)
class SetArrayElement:
    """Set element ``index`` of an existing flat array (a string array's element, a score, …)."""

    key: str
    index: int
    value: Any

    def describe(self) -> str:
        return f"set {_show(self.key)}[{self.index}]"


@dataclass(frozen=True)
class SetChatTemplate:
    """Set ``tokenizer.chat_template`` as gguf_new_metadata.py does: every ``tokenizer.chat_template*`` key (the
    named templates and their list too) is removed, and the new template is written after the file's other keys,
    first among the added ones."""

    template: str

    def describe(self) -> str:
        return "set the chat template"


@dataclass(frozen=True)
class SetSpecialToken:
    """Set a special token id by name (``eos``, ``bos``, ``pad``, …; :data:`SPECIAL_TOKENS`) as UINT32: ``token`` is
    an id below the vocabulary size or the text of a token in ``tokenizer.ggml.tokens`` (its first id)."""

    name: str
    token: int | str

    def describe(self) -> str:
        return f"set the {_show(self.name)} token to {_show(repr(self.token))}"


EditOp = SetValue | AddKey | DeleteKey | SetArrayElement | SetChatTemplate | SetSpecialToken


# ------------------------------------------------------------------------------------------------------------ state
@dataclass(frozen=True)
class ResultEntry:
    """One key of the edited metadata. ``value`` is ``None`` for an entry kept as stored (then ``original`` is
    set); ``status`` is ``kept``, ``changed`` (the file had the key; it has a new value, and may have moved: see
    :class:`MetadataState`) or ``added`` (the file did not have it)."""

    key: str
    status: str
    value: TypedValue | None
    original: MetadataValue | None

    @property
    def type(self) -> ValueType:
        if self.value is not None:
            return self.value.type
        assert self.original is not None
        return self.original.type

    @property
    def elem_type(self) -> ValueType | None:
        return self.value.elem_type if self.value is not None else self.original.elem_type if self.original else None

    @property
    def type_label(self) -> str:
        if self.value is not None:
            return self.value.type_label
        assert self.original is not None
        return self.original.type_label

    @property
    def python_value(self) -> Any:
        """The value as the reader would return it (a view for arrays kept as stored)."""
        if self.value is not None:
            return self.value.value
        assert self.original is not None
        return self.original.value


def _find_token(seq: Sequence[str], text: str) -> list[int]:
    """Every id whose token text is ``text``."""
    if isinstance(seq, ArrayPatch):
        ids = [i for i in _find_token(seq.base, text) if i not in seq.patches]
        ids += [i for i, v in seq.patches.items() if v == text]
        return sorted(ids)
    if isinstance(seq, StringArray):
        raw = text.encode("utf-8")
        needle = encode_string(raw)
        blob = seq.copy()
        offs = seq.offsets()
        out: list[int] = []
        pos = blob.find(needle)
        while pos >= 0:
            k = bisect.bisect_left(offs, pos)
            if k < len(seq) and offs[k] == pos:
                out.append(k)
            pos = blob.find(needle, pos + 1)
        return out
    return [i for i, s in enumerate(seq) if s == text]


class MetadataState:
    """The effective metadata: the original entries plus the operations applied so far, in order.

    Order of the result (:meth:`entries`): ``general.architecture`` first (gguf-py's writer always puts it there),
    then the original keys in their order (a changed key stays in place, a deleted one is gone), then the chat
    template set by :class:`SetChatTemplate`, then added keys in the order they were added."""

    def __init__(self, original: Mapping[str, MetadataValue]) -> None:
        self.original = original
        self._values: dict[str, TypedValue | MetadataValue] = dict(original)
        self._placed: dict[str, None] = dict.fromkeys(original)
        self._appended: list[str] = []
        self.warnings: list[str] = []

    @classmethod
    def replay(cls, original: Mapping[str, MetadataValue], ops: Iterable[EditOp]) -> MetadataState:
        """The state after ``ops``; raises :class:`EditError` (naming the operation) at the first invalid one."""
        st = cls(original)
        for i, op in enumerate(ops):
            try:
                st.apply(op)
            except EditError as exc:
                raise EditError(f"edit {i + 1} ({_describe(op)}): {exc}") from None
        return st

    # ---------------------------------------------------------------- queries
    def __contains__(self, key: object) -> bool:
        return key in self._values

    def keys(self) -> list[str]:
        """Keys in their output order."""
        keys = list(self._placed) + self._appended
        if ARCHITECTURE_KEY in self._values and keys[0] != ARCHITECTURE_KEY:
            keys.remove(ARCHITECTURE_KEY)
            keys.insert(0, ARCHITECTURE_KEY)
        return keys

    def type_of(self, key: str) -> tuple[ValueType, ValueType | None] | None:
        v = self._values.get(key)
        if v is None:
            return None
        return v.type, v.elem_type

    def value(self, key: str, default: Any = None) -> Any:
        """The effective Python value of ``key``."""
        v = self._values.get(key)
        return default if v is None else v.value

    @property
    def alignment(self) -> int:
        """The data alignment the edited file will have."""
        v = self._values.get(ALIGNMENT_KEY)
        return DEFAULT_ALIGNMENT if v is None else int(v.value)

    @property
    def architecture(self) -> str | None:
        v = self.value(ARCHITECTURE_KEY)
        return v if isinstance(v, str) else None

    def vocabulary(self) -> Sequence[str] | None:
        """The effective ``tokenizer.ggml.tokens`` (``None`` without a string array there)."""
        v = self._values.get(TOKENS_KEY)
        if v is None or v.type != _T.ARRAY or v.elem_type != _T.STRING:
            return None
        return v.value  # type: ignore[no-any-return]

    def entries(self) -> list[ResultEntry]:
        """The resulting ordered key/value list."""
        out = []
        for k in self.keys():
            v = self._values[k]
            if isinstance(v, MetadataValue):
                out.append(ResultEntry(k, "kept", None, v))
            else:
                status = "changed" if k in self.original else "added"
                out.append(ResultEntry(k, status, v, self.original.get(k)))
        return out

    def deleted(self) -> list[str]:
        """Original keys no longer present."""
        return [k for k in self.original if k not in self._values]

    # ---------------------------------------------------------------- changes
    def apply(self, op: EditOp) -> None:
        """Validate ``op`` against this state and apply it (raises :class:`EditError`, leaving the state as it was,
        when it cannot be made)."""
        if isinstance(op, (SetValue, AddKey)):
            if not isinstance(op.value, TypedValue):
                raise EditError(f"the value of {_show(str(op.key))} must be a TypedValue")
            exists = isinstance(op.key, str) and op.key in self._values
            _check_not_split(op.key)
            if isinstance(op, AddKey) and exists:
                raise EditError(f"key {_show(op.key)} already exists (set it instead)")
            if not exists:
                check_key(op.key)
            self._check_typed(op.key, op.value)
            self._put(op.key, op.value)
        elif isinstance(op, DeleteKey):
            if not isinstance(op.key, str) or op.key not in self._values:
                raise EditError(f"there is no key {_show(str(op.key))} to delete")
            _check_not_split(op.key)
            if op.key == ARCHITECTURE_KEY:
                raise EditError("general.architecture cannot be deleted: llama.cpp and gguf-py need it to load the "
                                "file (gguf_new_metadata.py keeps it too); set another value instead")
            self._delete(op.key)
        elif isinstance(op, SetArrayElement):
            self._set_element(op)
        elif isinstance(op, SetChatTemplate):
            tv = TypedValue(_T.STRING, op.template)
            if not tv.value:
                raise EditError("the chat template is empty (to remove it, delete tokenizer.chat_template)")
            for k in [k for k in self._values if k.startswith(CHAT_TEMPLATE_KEY)]:
                self._delete(k)
            self._values[CHAT_TEMPLATE_KEY] = tv
            self._appended.insert(0, CHAT_TEMPLATE_KEY)
        elif isinstance(op, SetSpecialToken):
            self._set_special(op)
        else:
            raise EditError(f"unknown edit operation {type(op).__name__}")

    def _put(self, key: str, value: TypedValue) -> None:
        if key not in self._values:
            self._appended.append(key)
        self._values[key] = value

    def _delete(self, key: str) -> None:
        del self._values[key]
        self._placed.pop(key, None)
        if key in self._appended:
            self._appended.remove(key)

    def _check_typed(self, key: str, tv: TypedValue) -> None:
        want = KNOWN_TYPES.get(key)
        have = self.type_of(key)
        got = (tv.type, tv.elem_type)
        if want is not None and got != want:
            label = type_label(*want)
            if got != have or key == ARCHITECTURE_KEY:
                raise EditError(f"{key} must be {label} (llama.cpp refuses any other type), not {tv.type_label}")
            self.warnings.append(f"{key} keeps its type {tv.type_label}; llama.cpp reads it only as {label} and "
                                 "refuses the file until it has that type")
            return  # a value of the wrong type kept as it is: none of the checks below applies to it
        if key == ALIGNMENT_KEY:
            a = tv.value
            if a % 8 or a & (a - 1) or a > MAX_ALIGNMENT:
                raise EditError(f"general.alignment {a} must be a power of two, a multiple of 8, at most "
                                f"{MAX_ALIGNMENT:,}")
        elif key == ARCHITECTURE_KEY:
            a = tv.value
            if not a or not a.isprintable() or any(c.isspace() or c == "." for c in a):
                raise EditError(f"general.architecture {_show(a)!r} must be a non-empty name without dots, spaces "
                                "or control characters")
            old = self.architecture
            if old and a != old:
                stale = sum(1 for k in self._values if k.startswith(old + "."))
                if stale:
                    self.warnings.append(f"general.architecture changes from {old!r} to {a!r}: the {stale} keys "
                                         f"{old}.* will not be read for {a!r}")
        elif key in _SPECIAL_KEYS and tv.type == _T.UINT32:
            vocab = self.vocabulary()
            if vocab is not None and tv.value >= len(vocab):
                raise EditError(f"{key} = {tv.value} is not a token id: the vocabulary has {len(vocab):,} tokens")
        elif key == TOKENS_KEY and have == want:
            old_n = len(self._values[key].value)
            if len(tv.value) != old_n:
                self.warnings.append(f"the vocabulary changes from {old_n:,} to {len(tv.value):,} tokens; "
                                     "tokenizer.ggml.scores/token_type and the embedding must match it")

    def _set_element(self, op: SetArrayElement) -> None:
        cur = self._values.get(op.key) if isinstance(op.key, str) else None
        if cur is None:
            raise EditError(f"there is no key {_show(str(op.key))}")
        if cur.type != _T.ARRAY:
            raise EditError(f"{_show(op.key)} is {cur.type.name}, not an array")
        assert cur.elem_type is not None
        if cur.elem_type == _T.ARRAY:
            raise EditError(f"{_show(op.key)} is an array of arrays; set it whole instead")
        idx = op.index
        if isinstance(idx, bool) or not isinstance(idx, numbers.Integral):
            raise EditError(f"the index into {_show(op.key)} must be an integer")
        n = len(cur.value) if isinstance(cur, TypedValue) else cur.count or 0
        if not 0 <= int(idx) < n:
            raise EditError(f"index {idx} is out of range: {_show(op.key)} has {n:,} elements")
        v = _scalar(cur.elem_type, op.value, f"{_show(op.key)}[{idx}]")
        if isinstance(cur, MetadataValue):
            base: Sequence[Any] = cur.value if cur.elem_type == _T.STRING else cur.numbers()  # type: ignore[assignment]
        else:
            base = cur.value
        new = TypedValue(_T.ARRAY, ArrayPatch(base, {int(idx): v}), cur.elem_type)
        self._values[op.key] = new

    def _set_special(self, op: SetSpecialToken) -> None:
        name = op.name.strip().lower() if isinstance(op.name, str) else op.name
        key = SPECIAL_TOKENS.get(name) if isinstance(name, str) else None
        if key is None and isinstance(name, str) and name in _SPECIAL_KEYS:
            key = name
        if key is None:
            names = ", ".join(sorted(set(SPECIAL_TOKENS)))
            raise EditError(f"unknown special token {_show(str(op.name))!r} (one of {names})")
        vocab = self.vocabulary()
        if vocab is None:
            raise EditError(f"the file has no {TOKENS_KEY} to check the token against (set {key} with an explicit "
                            "UINT32 value instead)")
        tok = op.token
        if isinstance(tok, str):
            ids = _find_token(vocab, tok)
            if not ids:
                raise EditError(f"there is no token {_show(tok)!r} in the vocabulary")
            if len(ids) > 1:
                self.warnings.append(f"token {_show(tok)!r} has {len(ids)} ids ({', '.join(map(str, ids[:8]))}"
                                     f"{'…' if len(ids) > 8 else ''}); {op.name} uses the first, {ids[0]}")
            tid = ids[0]
        elif isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
            raise EditError(f"a token is an id or a token text, not {type(tok).__name__}")
        else:
            tid = int(tok)
            if not 0 <= tid < len(vocab):
                raise EditError(f"token id {tid} is out of range: the vocabulary has {len(vocab):,} tokens "
                                f"(0..{len(vocab) - 1})")
        self._put(key, TypedValue(_T.UINT32, tid))


def _check_not_split(key: Any) -> None:
    if isinstance(key, str) and key in SPLIT_KEYS:
        raise EditError(f"{key} describes how the model is split into files; an edit cannot change that "
                        "(llama-gguf-split can)")


def _describe(op: Any) -> str:
    try:
        return str(op.describe())
    except Exception:  # a malformed operation still gets a message
        return type(op).__name__


def _original_metadata(source: GGUFFile | Mapping[str, MetadataValue]) -> Mapping[str, MetadataValue]:
    return source.metadata if isinstance(source, GGUFFile) else source


class EditList:
    """Edit operations over one file's metadata, with undo and redo.

    :meth:`apply` validates the operation against the current state and appends it (dropping any undone ones);
    :meth:`undo` and :meth:`redo` move the cursor. :attr:`state` is recomputed from the original metadata and the
    operations before the cursor."""

    def __init__(self, source: GGUFFile | Mapping[str, MetadataValue], ops: Iterable[EditOp] = ()) -> None:
        self.original = _original_metadata(source)
        self._ops: list[EditOp] = []
        self._cursor = 0
        self._state: MetadataState | None = MetadataState(self.original)
        for op in ops:
            self.apply(op)

    @property
    def ops(self) -> tuple[EditOp, ...]:
        """The applied operations (before the cursor)."""
        return tuple(self._ops[: self._cursor])

    @property
    def undone(self) -> tuple[EditOp, ...]:
        """Operations :meth:`redo` would re-apply, next first."""
        return tuple(self._ops[self._cursor :])

    def __len__(self) -> int:
        return self._cursor

    @property
    def state(self) -> MetadataState:
        if self._state is None:
            self._state = MetadataState.replay(self.original, self._ops[: self._cursor])
        return self._state

    def apply(self, op: EditOp) -> MetadataState:
        """Apply ``op`` (raises :class:`EditError` and changes nothing when it is invalid); returns the new state."""
        st = MetadataState.replay(self.original, self._ops[: self._cursor])
        st.apply(op)
        del self._ops[self._cursor :]
        self._ops.append(op)
        self._cursor += 1
        self._state = st
        return st

    @property
    def can_undo(self) -> bool:
        return self._cursor > 0

    @property
    def can_redo(self) -> bool:
        return self._cursor < len(self._ops)

    def undo(self) -> EditOp | None:
        """Step back over the last applied operation; returns it (``None`` when there is none)."""
        if not self._cursor:
            return None
        self._cursor -= 1
        self._state = None
        return self._ops[self._cursor]

    def redo(self) -> EditOp | None:
        """Re-apply the next undone operation; returns it (``None`` when there is none)."""
        if self._cursor >= len(self._ops):
            return None
        self._cursor += 1
        self._state = None
        return self._ops[self._cursor - 1]

    def entries(self) -> list[ResultEntry]:
        """The resulting ordered key/value list."""
        return self.state.entries()


def resulting_entries(source: GGUFFile | Mapping[str, MetadataValue], ops: Iterable[EditOp]) -> list[ResultEntry]:
    """The ordered key/value list ``ops`` make of ``source``'s metadata (see :class:`MetadataState`)."""
    return MetadataState.replay(_original_metadata(source), ops).entries()


# ------------------------------------------------------------------------------------------------------------- save
@dataclass(frozen=True)
class TensorCopy:
    """A tensor of the output: its info and its new offset in the data section."""

    info: TensorInfo
    offset: int


@dataclass
class EditPlan:
    """Everything :func:`save_edited` writes, and what a dry run shows."""

    entries: list[ResultEntry]
    deleted: list[str]
    header: bytes
    tensors: list[TensorCopy]
    alignment: int
    source_alignment: int
    warnings: list[str] = field(default_factory=list)

    @property
    def realigned(self) -> bool:
        """Whether tensor offsets moved because the alignment changed."""
        return self.alignment != self.source_alignment

    @property
    def file_bytes(self) -> int:
        return len(self.header) + sum(pad_to(t.info.n_bytes or 0, self.alignment) for t in self.tensors)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.info.n_bytes or 0 for t in self.tensors)

    def changes(self) -> list[dict[str, Any]]:
        """Each added, changed or deleted key: ``{"key", "status", "type", "old_type"}``, in output order, deleted
        keys last."""
        out: list[dict[str, Any]] = []
        for e in self.entries:
            if e.status == "kept":
                continue
            out.append({"key": e.key, "status": e.status, "type": e.type_label,
                        "old_type": e.original.type_label if e.original is not None else None,
                        "value": preview(e.python_value)})
        for k in self.deleted:
            out.append({"key": k, "status": "deleted", "type": None, "old_type": None, "value": None})
        return out


def preview(value: Any, limit: int = 200) -> Any:
    """A short JSON-able rendering of a value (long text cut, arrays as their count and first elements)."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[: limit - 1] + "…"
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    try:
        n = len(value)
    except TypeError:
        return str(value)[:limit]
    head = [preview(value[i], 40) for i in range(min(n, 8))]
    head = [x.item() if hasattr(x, "item") else x for x in head]
    return {"count": n, "first": head}


def plan_edit(src: GGUFFile, edits: EditList | Iterable[EditOp]) -> EditPlan:
    """The output of ``edits`` applied to ``src`` (header bytes and tensor layout); raises :class:`EditError` for
    an invalid edit or a tensor that cannot be copied."""
    ops = edits.ops if isinstance(edits, EditList) else list(edits)
    if getattr(src, "is_split", False):
        raise EditError(f"{src.path} was opened as a split model of {len(src.shards)} files; edit one file at a "
                        "time (open it with whole_set=False: the first holds the model's metadata)")
    state = MetadataState.replay(src.metadata, ops)
    for t in src.tensors:
        if t.problem is not None or t.n_bytes is None:
            raise EditError(f"tensor {_show(t.name)} cannot be copied: {t.problem or 'its size is unknown'}")
    entries = state.entries()
    header = GGUFHeader(state.alignment, OUTPUT_VERSION)
    for e in entries:
        header.add_raw(src.entry_bytes(e.key) if e.value is None else encode_entry(e.key, e.value))
    copies = [TensorCopy(t, header.add_tensor(t.name, t.ne, t.type_id, t.n_bytes or 0)) for t in src.tensors]
    alignment = header.alignment
    # gguf-py pads before the first tensor only (a file without tensors ends after its infos)
    head = header.encode(pad_without_tensors=False)
    return EditPlan(entries, state.deleted(), head, copies, alignment, src.alignment, list(state.warnings))


@dataclass(frozen=True)
class EditResult:
    """What :func:`save_edited` wrote."""

    path: Path
    plan: EditPlan


#: tests switch this off to exercise the read/write fallback (the only path on macOS and Windows)
USE_COPY_FILE_RANGE = fsutil.HAS_COPY_FILE_RANGE
_CFR_FALLBACK = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM,
                 getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


class _Copier:
    """Tensor bytes from the source (a descriptor, or the in-memory buffer) to the output descriptor."""

    def __init__(self, src_fd: int | None, buf: Any, out_fd: int, cancel: CancelFlag | None,
                 step: Callable[[int], None]) -> None:
        self.src_fd = src_fd
        self.buf = buf
        self.out_fd = out_fd
        self.cancel = cancel
        self.step = step
        self.cfr = USE_COPY_FILE_RANGE and src_fd is not None

    def write(self, data: bytes | memoryview) -> None:
        mv = memoryview(data)
        while mv:
            mv = mv[os.write(self.out_fd, mv) :]

    def copy(self, offset: int, n: int, what: str) -> None:
        pos, left = offset, n
        while left:
            check_cancel(self.cancel, EditCancelled)
            want = min(left, COPY_CHUNK)
            got = 0
            if self.cfr:
                assert self.src_fd is not None
                try:
                    got = fsutil.copy_file_range(self.src_fd, self.out_fd, want, pos)
                except OSError as exc:
                    if exc.errno not in _CFR_FALLBACK:
                        raise
                    self.cfr = False
                    continue
            elif self.src_fd is not None:
                data = fsutil.pread(self.src_fd, want, pos)
                self.write(data)
                got = len(data)
            else:
                from ..native.mapped import copy_bytes

                self.write(copy_bytes(self.buf, pos, pos + want, what))
                got = want
            if got <= 0:
                raise EditError(f"{what}: the input ended {left:,} bytes early (it changed while it was copied)")
            pos += got
            left -= got
            self.step(got)


def _source_fd(f: GGUFFile) -> int:
    """A descriptor on ``f``'s file, checked to be the file ``f`` parsed (same size, same header bytes)."""
    assert f.path is not None
    fd = open_input(f.path)
    try:
        if os.fstat(fd).st_size != f.file_size:
            raise EditError(f"{f.path} changed since it was opened (its size differs); open it again")
        from ..native.mapped import copy_bytes

        mapped = copy_bytes(f._buf, 0, f.header_end, "header")
        pos = 0
        while pos < len(mapped):
            chunk = fsutil.pread(fd, min(16 << 20, len(mapped) - pos), pos)
            if not chunk or chunk != mapped[pos : pos + len(chunk)]:
                raise EditError(f"{f.path} changed since it was opened (its header differs); open it again")
            pos += len(chunk)
    except BaseException:
        os.close(fd)
        raise
    return fd


def save_edited(src: GGUFFile | str | os.PathLike[str], dst: str | os.PathLike[str],
                edits: EditList | Iterable[EditOp], *, progress: Progress | None = None,
                cancel: CancelFlag | None = None, overwrite_source: bool = False) -> EditResult:
    """Write ``src`` with ``edits`` applied to ``dst``, atomically.

    Refuses a ``dst`` that is ``src`` (also through a symlink or a hard link) unless ``overwrite_source``; even
    then the new file is written to a temporary and renamed over it. A path ``src`` is opened alone (a shard of a
    split model is edited as one file) and the other shards its name implies are never overwritten.
    ``progress(done, total)`` counts output bytes; ``cancel`` stops the copy (:class:`EditCancelled`) and nothing
    is left behind. Raises :class:`EditError` for an invalid edit, :class:`~quantscope.core.fsutil.PathRefused`
    for an unusable ``dst``, ``OSError`` when writing fails."""
    if isinstance(src, GGUFFile):
        return _save(src, dst, edits, progress, cancel, overwrite_source)
    with GGUFFile(src, whole_set=False) as f:
        return _save(f, dst, edits, progress, cancel, overwrite_source)


def _save(f: GGUFFile, dst: str | os.PathLike[str], edits: EditList | Iterable[EditOp], progress: Progress | None,
          cancel: CancelFlag | None, overwrite_source: bool) -> EditResult:
    plan = plan_edit(f, edits)
    total = plan.file_bytes
    report = progress or (lambda _d, _t: None)
    inputs: list[Path] = []
    if f.path is not None:  # the input, and the other shards of a set it belongs to
        inputs = [p for p in sibling_shards(f.path) if not (overwrite_source and p == f.path)]
    with OutputSet([("output", dst)], inputs=inputs,
                   replaces=[f.path] if overwrite_source and f.path is not None else []) as outs:
        check_cancel(cancel, EditCancelled)
        src_fd = _source_fd(f) if f.path is not None else None
        try:
            out_fd = outs.open("output")
            done = 0

            def step(n: int) -> None:
                nonlocal done
                done += n
                report(done, total)

            cp = _Copier(src_fd, f._buf, out_fd, cancel, step)
            cp.write(plan.header)
            step(len(plan.header))
            data = DataSection(cp.write, plan.alignment, [tc.info.n_bytes or 0 for tc in plan.tensors])
            for tc in plan.tensors:
                n = tc.info.n_bytes or 0
                cp.copy(tc.info.data_offset, n, f"tensor {_show(tc.info.name)}")
                data.count(n)
                pad = data.end_tensor()
                if pad:
                    step(pad)
            data.finish()
            if os.fstat(out_fd).st_size != total:
                raise EditError(f"wrote {os.fstat(out_fd).st_size:,} bytes, expected {total:,}")
            check_cancel(cancel, EditCancelled)
            outs.commit()
        finally:
            if src_fd is not None:
                os.close(src_fd)
        return EditResult(outs.target("output"), plan)


__all__ = [
    "ARCH_KEY_TYPES", "KNOWN_TYPES", "MAX_ALIGNMENT", "MAX_KEY_BYTES", "SPECIAL_TOKENS", "AddKey", "ArrayPatch",
    "DeleteKey", "EditCancelled", "EditError", "EditList", "EditOp", "EditPlan", "EditResult",
    "MetadataState", "ResultEntry", "SetArrayElement", "SetChatTemplate", "SetSpecialToken", "SetValue",
    "TensorCopy", "TypedValue", "check_key", "encode_entry", "known_type", "parse_type", "parse_value", "plan_edit",
    "preview", "resulting_entries", "save_edited", "type_label",
]
