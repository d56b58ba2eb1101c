"""JSON output by constrained sampling: ``response_format`` ``json_object`` (any JSON object) and
``json_schema``, llama-server's ``json_schema`` and ``grammar`` fields, and tool calls, enforced byte by byte on
every sampled token. This module is the front door: :func:`initial`, :func:`step`, :func:`feed`,
:func:`can_end` and :func:`closed` take both kinds of schema it compiles.

:func:`compile_schema` turns a schema into a normalized tree for the automaton below when it keeps to its subset:
``type`` (one or a list), ``properties``, ``required``, ``additionalProperties`` (false, true or a schema),
``items``, ``enum``, ``const``; annotations (``title``, ``description``, ``default``, ``examples``, ``$schema``,
``$id``, ``$comment``) are ignored; a non-finite number (``1e999``) in a schema is refused. Any other schema is
compiled to a GBNF grammar (:mod:`.schema_grammar`: ``anyOf``, ``oneOf``, ``allOf``, ``$ref``, ``pattern``,
``format``, bounds, lengths, item counts) matched by :mod:`.grammar` as ``("grammar", Grammar)``; what neither
can enforce raises :class:`SchemaError` naming the keyword (the server answers 400: a schema is never silently
ignored). :func:`compile_grammar` reads the ``grammar`` field.

:func:`step` is a pushdown automaton over the output's bytes whose states are immutable tuples, so trying a
candidate token never disturbs the current state. Each byte costs a bounded amount of work: enum values and
property names are kept sorted and narrowed by binary search (never scanned), and a key is compared with the
others as the text it stands for (``"\\u0061"`` is ``"a"``: a key given twice through an escape is refused).
Strings are UTF-8 as Python decodes it (no overlong form, surrogate or code point beyond U+10FFFF).
A grammar's state is a bounded set of stacks (see :mod:`.grammar`); the automaton stays the path of the subset
because it is several times cheaper per byte and refuses repeated keys, which a grammar cannot.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from typing import Any

from . import grammar as gbnf
from .grammar import Grammar, parse_grammar
from .schema_grammar import ANNOTATIONS, MAX_DEPTH, MAX_NAMES, SchemaError, call_grammar, schema_grammar

KNOWN = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "const"}) | ANNOTATIONS
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
MAX_WS = 64  # consecutive whitespace bytes between tokens (a model may otherwise emit blank lines forever)
WS = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")

Schema = tuple[Any, ...]
ANY: Schema = ("any",)
ANY_OBJECT: Schema = ("types", ("object",), {}, frozenset(), ANY, None, ())


def compile_schema(schema: Any, path: str = "schema", depth: int = 0, grammar: bool = True) -> Schema:
    """The normalized form of ``schema`` (see the module's docstring); :class:`SchemaError` otherwise.
    ``("types", kinds, properties, required, additional, items, sorted property names)`` or ``("enum", sorted
    literals)`` or :data:`ANY` for the automaton's subset; else (``grammar``) ``("grammar", Grammar)``: the
    schema compiled to a grammar (:mod:`.schema_grammar`)."""
    try:
        return _subset(schema, path, depth)
    except SchemaError:
        if not grammar:
            raise
    return ("grammar", schema_grammar(schema, depth))


def compile_grammar(text: Any) -> Schema:
    """A GBNF grammar (the ``grammar`` request field) as a schema of this module: ``("grammar", Grammar)``;
    :class:`~.grammar.GrammarError` when it cannot be used."""
    return ("grammar", parse_grammar(text))


def _subset(schema: Any, path: str, depth: int) -> Schema:
    if schema is True or schema == {}:
        return ANY
    if depth >= MAX_DEPTH:
        raise SchemaError(f"{path}: nested more than {MAX_DEPTH} levels")
    if not isinstance(schema, dict):
        raise SchemaError(f"{path} must be an object")
    bad = sorted(k for k in schema if k not in KNOWN)
    if bad:
        raise SchemaError(f"{path}: the keyword {bad[0]!r} cannot be enforced")
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values or len(values) > MAX_NAMES:
            raise SchemaError(f"{path}.enum must be a non-empty list of at most {MAX_NAMES} values")
        try:
            lits = tuple(sorted({json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
                                 for v in values}))
        except (TypeError, ValueError):  # (ValueError: a non-finite number, or a lone surrogate)
            raise SchemaError(f"{path}.enum holds a value that is not JSON (or a number that is not finite)") from None
        return ("enum", lits)
    kind = schema.get("type")
    if kind is None:
        kinds: tuple[str, ...] = ("object",) if "properties" in schema else TYPES
    elif isinstance(kind, str):
        kinds = (kind,)
    elif isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        kinds = tuple(dict.fromkeys(kind))
    else:
        raise SchemaError(f"{path}.type must be a type name or a list of them")
    unknown = next((k for k in kinds if k not in TYPES), None)
    if unknown is not None:
        raise SchemaError(f"{path}.type {unknown!r} is not a JSON Schema type")
    props: dict[bytes, Schema] = {}
    required: frozenset[bytes] = frozenset()
    extra: Schema | None = ANY
    items: Schema | None = None
    if "object" in kinds:
        p = schema.get("properties", {})
        if not isinstance(p, dict) or len(p) > MAX_NAMES:
            raise SchemaError(f"{path}.properties must be an object of at most {MAX_NAMES} properties")
        props = {_key(name): _subset(sub, f"{path}.properties.{name}", depth + 1) for name, sub in p.items()}
        req = schema.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise SchemaError(f"{path}.required must be a list of names")
        required = frozenset(_key(r) for r in req)
        add = schema.get("additionalProperties", True)
        if add is False:
            extra = None
            missing = required - props.keys()
            if missing:
                raise SchemaError(f"{path}: required {sorted(missing)[0].decode()!r} is not among the properties")
        elif add is not True:
            extra = _subset(add, f"{path}.additionalProperties", depth + 1)
    if "array" in kinds:
        items = _subset(schema.get("items", True), f"{path}.items", depth + 1)
    return ("types", kinds, props, required, extra, items, tuple(sorted(props)))


def call_union(params: dict[str, Any]) -> Schema:
    """A tool call among several tools: ``{"name": "NAME", "arguments": ARGS}`` written in that order and spacing,
    ARGS held to the parameters of the tool NAME names (``params``: name -> its parameters' JSON Schema; a tool
    without them takes any object). :class:`SchemaError` when some tool's parameters cannot be enforced."""
    heads: dict[bytes, Schema] = {}
    for name, schema in params.items():
        sub = compile_schema(schema if schema is not None else {"type": "object"}, f"{name}.parameters", 1)
        if sub[0] == "grammar":  # some tool's parameters need the grammar: the whole call is one
            return ("grammar", call_grammar({n: p if p is not None else {"type": "object"}
                                             for n, p in params.items()}))
        heads.setdefault(b'{"name": "' + _key(name) + b'", "arguments": ', sub)
    return ("call", tuple(sorted(heads)), heads)


def _key(name: Any) -> bytes:
    if not isinstance(name, str):
        raise SchemaError("property names must be strings")
    try:
        return json.dumps(name, ensure_ascii=False)[1:-1].encode()
    except UnicodeEncodeError:
        raise SchemaError("property names must be valid Unicode text") from None


def _canonical(raw: bytes) -> bytes | None:
    """A key's JSON-escaped text as :func:`_key` writes it (``\\u0061`` is ``a``); None for a lone surrogate."""
    try:
        return json.dumps(json.loads(b'"' + raw + b'"'), ensure_ascii=False)[1:-1].encode()
    except (ValueError, UnicodeEncodeError):
        return None


def _narrow(opts: tuple[bytes, ...], lo: int, hi: int, pos: int, c: int) -> tuple[int, int]:
    """The range of ``opts[lo:hi]`` (sorted, sharing their first ``pos`` bytes) whose byte at ``pos`` is ``c``:
    two binary searches (the values that end at ``pos`` sort first)."""

    def at(o: bytes) -> int:
        return o[pos] if len(o) > pos else -1

    a = bisect_left(opts, c, lo, hi, key=at)
    return a, bisect_right(opts, c, a, hi, key=at)


# ---------------------------------------------------------------------------------------------------- automaton
# A state is (stack, ws, done): stack a tuple of frames (innermost last), ws the run of whitespace bytes so far,
# done: the top-level value is complete. Frames:
#   ("value", schema, depth)                      a value is expected
#   ("obj", schema, seen, phase, key, depth)      phase: "first" "key" "colon" "value" "next"
#   ("arr", items, phase, depth)                  phase: "first" "value" "next"
#   ("str", allowed, buf, esc, is_key)            allowed: None (any text) or (names, lo, hi): the property
#                                                 names names[lo:hi] (sorted, JSON-escaped) still match
#   ("num", integer, sub)                         sub: "-" "0" "int" "." "frac" "e" "esign" "exp"
#   ("lit", options, lo, hi, pos)                 exact byte strings (true, false, null, enum values), sorted:
#                                                 options[lo:hi] match the pos bytes so far
#   ("head", schema, lo, hi, pos, depth)          a call's opening up to its arguments (call_union), as "lit"
#   ("call",)                                     a call's arguments complete: its closing brace is next
State = tuple[tuple[tuple[Any, ...], ...], int, bool]

_NUM_END = frozenset({"0", "int", "frac", "exp"})
#: a string's UTF-8: a lead byte -> its state (0: not one); a state -> (lowest, highest next byte, state after)
_UTF8_LEAD = [0] * 0xC2 + [-1] * 30 + [-11] + [-2] * 12 + [-12] + [-2] * 2 + [-13] + [-3] * 3 + [-14] + [0] * 11
_UTF8_NEXT = {-1: (0x80, 0xBF, 0), -2: (0x80, 0xBF, -1), -3: (0x80, 0xBF, -2), -11: (0xA0, 0xBF, -1),
              -12: (0x80, 0x9F, -1), -13: (0x90, 0xBF, -2), -14: (0x80, 0x8F, -2)}


def initial(schema: Schema) -> State:
    """The state before any output: one value of ``schema`` (a grammar's start for ``("grammar", g)``)."""
    if schema[0] == "grammar":
        return gbnf.initial(schema[1])  # type: ignore[return-value]
    return ((("value", schema, 0),), 0, False)


def _complete(stack: tuple[tuple[Any, ...], ...]) -> tuple[tuple[tuple[Any, ...], ...], bool]:
    """The stack after its top frame's value completed: the parent moves on (``done`` when it was the top)."""
    stack = stack[:-1]
    if not stack:
        return stack, True
    parent = stack[-1]
    if parent[0] == "obj":
        return (*stack[:-1], ("obj", parent[1], parent[2], "next", b"", parent[5])), False
    if parent[0] == "arr":
        return (*stack[:-1], ("arr", parent[1], "next", parent[3])), False
    if parent[0] == "call":
        return stack, False
    raise AssertionError(parent[0])


def _start_value(schema: Schema, depth: int, c: int) -> tuple[tuple[Any, ...], ...] | None:
    """The frames that byte ``c`` opens as the first byte of a value of ``schema`` (None: it cannot start one)."""
    if schema[0] == "enum":
        lo, hi = _narrow(schema[1], 0, len(schema[1]), 0, c)
        return (("lit", schema[1], lo, hi, 1),) if lo < hi else None
    if schema[0] == "call":
        if c != ord("{") or depth >= MAX_DEPTH:
            return None
        return (("head", schema, 0, len(schema[1]), 1, depth + 1),)
    kinds = TYPES if schema[0] == "any" else schema[1]
    if c == ord("{") and "object" in kinds:
        s = ANY_OBJECT if schema[0] == "any" else schema
        if depth >= MAX_DEPTH:
            return None
        return (("obj", s, frozenset(), "first", b"", depth + 1),)
    if c == ord("[") and "array" in kinds:
        items = ANY if schema[0] == "any" else schema[5]
        if depth >= MAX_DEPTH:
            return None
        return (("arr", items, "first", depth + 1),)
    if c == ord('"') and "string" in kinds:
        return (("str", None, b"", 0, False),)
    if (c == ord("-") or c in DIGITS) and ("number" in kinds or "integer" in kinds):
        integer = "number" not in kinds
        return (("num", integer, "-" if c == ord("-") else "0" if c == ord("0") else "int"),)
    if c == ord("t") and "boolean" in kinds:
        return (("lit", (b"true",), 0, 1, 1),)
    if c == ord("f") and "boolean" in kinds:
        return (("lit", (b"false",), 0, 1, 1),)
    if c == ord("n") and "null" in kinds:
        return (("lit", (b"null",), 0, 1, 1),)
    return None


def _num_next(sub: str, c: int, integer: bool) -> str | None:
    d = c in DIGITS
    if sub == "-":
        return "0" if c == ord("0") else "int" if d else None
    if sub in ("0", "int"):
        if sub == "int" and d:
            return "int"
        if integer:
            return None
        return "." if c == ord(".") else "e" if c in b"eE" else None
    if sub == ".":
        return "frac" if d else None
    if sub == "frac":
        return "frac" if d else "e" if c in b"eE" else None
    if sub == "e":
        return "exp" if d else "esign" if c in b"+-" else None
    if sub in ("esign", "exp"):
        return "exp" if d else None
    return None


def step(state: State, c: int) -> State | None:
    """The state after byte ``c``; None when no valid output continues this way."""
    if state[0].__class__ is Grammar:
        return gbnf.step(state, c)  # type: ignore[arg-type,return-value]
    return _step(state, c)


def _step(state: State, c: int) -> State | None:
    """:func:`step` for the automaton."""
    stack, ws, done = state
    while True:
        if not stack:  # the value is complete: only (a little) whitespace may follow
            return (stack, ws + 1, True) if c in WS and ws < MAX_WS else None
        top = stack[-1]
        kind = top[0]
        if kind == "str":
            _k, allowed, buf, esc, is_key = top
            if esc == 1:
                if c == ord("u"):
                    esc = 2
                elif c in b'"\\/bfnrt':
                    esc = 0
                else:
                    return None
            elif esc >= 2:
                if c not in HEX:
                    return None
                esc = 0 if esc == 5 else esc + 1
            elif esc < 0:  # within a UTF-8 character: -n continuation bytes to come (-1x: the first one narrowed)
                lo, hi, esc = _UTF8_NEXT[esc]
                if not lo <= c <= hi:
                    return None
            elif c >= 0x80:  # a UTF-8 lead byte: never overlong, a surrogate or beyond U+10FFFF
                esc = _UTF8_LEAD[c]
                if esc == 0:
                    return None
            elif c == ord("\\"):
                esc = 1
            elif c == ord('"'):
                if is_key:
                    parent = stack[-2]
                    if allowed is not None:
                        if allowed[1] >= allowed[2] or len(allowed[0][allowed[1]]) != len(buf):
                            return None  # not a whole name
                    elif b"\\" in buf:
                        key = _canonical(buf)
                        if key is None:
                            return None
                        buf = key
                    if buf in parent[2]:
                        return None  # a key already given
                    stack = (*stack[:-2], ("obj", parent[1], parent[2], "colon", buf, parent[5]))
                    return (stack, 0, False)
                stack, done = _complete(stack)
                return (stack, 0, done)
            elif c < 0x20:
                return None
            if is_key:
                if allowed is not None:
                    names, lo, hi = allowed
                    lo, hi = _narrow(names, lo, hi, len(buf), c)
                    seen = stack[-2][2]
                    # (each name passed over is a key already given: at most len(seen) of them)
                    if not any(names[i] not in seen for i in range(lo, hi)):
                        return None
                    allowed = (names, lo, hi)
                buf += bytes((c,))
            return ((*stack[:-1], ("str", allowed, buf, esc, is_key)), 0, False)
        if kind == "num":
            _k, integer, sub = top
            nxt = _num_next(sub, c, integer)
            if nxt is not None:
                return ((*stack[:-1], ("num", integer, nxt)), 0, False)
            if sub not in _NUM_END:
                return None
            stack, done = _complete(stack)  # the number ended: the byte belongs to what follows
            ws = 0
            continue
        if kind == "lit":
            _k, opts, lo, hi, pos = top
            a, b = _narrow(opts, lo, hi, pos, c)
            if b - a == 1 and len(opts[a]) == pos + 1:  # the only value, now whole
                stack, done = _complete(stack)
                return (stack, 0, done)
            if a < b:
                return ((*stack[:-1], ("lit", opts, a, b, pos + 1)), 0, False)
            if len(opts[lo]) != pos:  # (the shortest sorts first)
                return None
            # a value of exactly this length ends here (only numbers need a following byte to know it)
            stack, done = _complete(stack)
            ws = 0
            continue
        if kind == "head":
            _k, schema, lo, hi, pos, depth = top
            a, b = _narrow(schema[1], lo, hi, pos, c)
            if a == b:
                return None
            head = schema[1][a]
            if b - a == 1 and len(head) == pos + 1:  # the tool is known: its arguments follow
                return ((*stack[:-1], ("call",), ("value", schema[2][head], depth)), 0, False)
            return ((*stack[:-1], ("head", schema, a, b, pos + 1, depth)), 0, False)
        if c in WS:  # between the parts of a value, object or array
            return None if ws >= MAX_WS else (stack, ws + 1, False)
        if kind == "value":
            opened = _start_value(top[1], top[2], c)
            if opened is None:
                return None
            new = opened[-1]
            if new[0] == "lit" and new[3] - new[2] == 1 and len(new[1][new[2]]) == 1:  # a one-byte value, whole
                stack, done = _complete((*stack[:-1], new))
                return (stack, 0, done)
            return ((*stack[:-1], *opened), 0, False)
        if kind == "obj":
            _k, schema, seen, phase, key, depth = top
            props, required, extra = schema[2], schema[3], schema[4]
            if phase in ("first", "key") and c == ord('"'):
                if extra is not None:
                    return ((*stack, ("str", None, b"", 0, True)), 0, False)
                if len(seen) >= len(props):  # (without additional properties, every key seen is a property)
                    return None
                return ((*stack, ("str", (schema[6], 0, len(props)), b"", 0, True)), 0, False)
            if phase in ("first", "next") and c == ord("}"):
                if not required <= seen:
                    return None
                stack, done = _complete(stack)
                return (stack, 0, done)
            if phase == "next" and c == ord(","):
                if extra is None and len(seen) >= len(props):
                    return None
                return ((*stack[:-1], ("obj", schema, seen, "key", b"", depth)), 0, False)
            if phase == "colon" and c == ord(":"):
                sub = props.get(key, extra if extra is not None else ANY)
                frame = ("obj", schema, seen | {key}, "value", b"", depth)
                return ((*stack[:-1], frame, ("value", sub, depth)), 0, False)
            return None
        if kind == "call":
            if c != ord("}"):
                return None
            stack, done = _complete(stack)
            return (stack, 0, done)
        if kind == "arr":
            _k, items, phase, depth = top
            if phase in ("first", "next") and c == ord("]"):
                stack, done = _complete(stack)
                return (stack, 0, done)
            if phase == "next" and c == ord(","):
                return ((*stack[:-1], ("arr", items, "value", depth), ("value", items, depth)), 0, False)
            if phase == "first":  # the first item starts without a comma
                stack = (*stack[:-1], ("arr", items, "value", depth), ("value", items, depth))
                continue
            return None
        raise AssertionError(kind)


def feed(state: State | None, data: bytes) -> State | None:
    """The state after ``data`` (None: not a valid continuation)."""
    if state is not None and state[0].__class__ is Grammar:
        return gbnf.feed(state, data)  # type: ignore[arg-type,return-value]
    for c in data:
        if state is None:
            return None
        state = _step(state, c)
    return state


def can_end(state: State) -> bool:
    """Whether the output may end here: the value is complete (a number or a literal at the top level ends
    with the output)."""
    if state[0].__class__ is Grammar:
        return gbnf.can_end(state)  # type: ignore[arg-type]
    stack, _ws, done = state
    if done and not stack:
        return True
    if len(stack) == 1 and stack[0][0] == "num":
        return stack[0][2] in _NUM_END
    if len(stack) == 1 and stack[0][0] == "lit":
        _k, opts, lo, _hi, pos = stack[0]
        return len(opts[lo]) == pos
    return False


def closed(state: State) -> bool:
    """Whether the value is complete and nothing but whitespace may follow (generation can stop)."""
    if state[0].__class__ is Grammar:
        return gbnf.closed(state)  # type: ignore[arg-type]
    return state[2] and not state[0]
