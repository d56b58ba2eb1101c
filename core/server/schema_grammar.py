"""JSON Schema to a GBNF grammar (:mod:`.grammar`), for the schemas the automaton of :mod:`.jsonmode` does not
take: the same approach and output shape as llama.cpp's common/json-schema-to-grammar.cpp (values as llama.cpp
writes them: whitespace ``space`` between tokens, required properties first in the schema's order, then the
optional ones in order), every keyword either enforced or refused by name (:class:`~.jsonmode.SchemaError`).

Enforced beyond the automaton's subset: ``anyOf``; ``oneOf`` where its branches cannot overlap (different JSON
types, or objects told apart by a required property's ``const``/``enum``); ``allOf`` of object schemas (their
properties and ``required`` merged; the same property in two branches must have the same schema); ``$ref`` to
``#``, ``#/$defs/…``, ``#/definitions/…`` or any JSON pointer into the schema (recursion is bounded by the
matcher's stack); ``pattern`` (anchored ``^…$`` or not: an unanchored one may have text around it) in the regex
subset llama.cpp converts (literals, ``.``, classes, groups, ``|``, ``* + ? {m,n}``) plus ``\\d \\w \\s``;
``format`` ``date``, ``time``, ``date-time``, ``uuid`` (llama.cpp's rules) and ``email``; ``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` for integers (up to 16 digits, as llama.cpp);
``minLength``/``maxLength``; ``minItems``/``maxItems``; ``prefixItems``. Refused by name: ``uniqueItems``,
``not``, ``if``/``then``/``else``, ``minProperties``/``maxProperties``, ``patternProperties``, ``multipleOf``,
numeric bounds on a non-integer ``number``, remote ``$ref``, …: a schema is never silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar

from .grammar import Grammar, GrammarError, parse_grammar

#: keywords that describe but do not constrain
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly"})
#: nesting: a schema's levels (only ``true`` / ``{}`` may sit deeper: they are held to scalars there), and the
#: containers the output may open (the automaton of :mod:`.jsonmode`); one constant, so that every schema
#: accepted can be generated
MAX_DEPTH = 32
MAX_NAMES = 1024  # properties per object, values per enum, branches of an anyOf
MAX_RULES = 4096  # rules one schema may produce
MAX_LEN = 2000  # minLength/maxLength/minItems/maxItems beyond: refused (llama.cpp's repetition limit)
INT_DIGITS = 16  # an integer without a bound on one side has at most this many digits there (as llama.cpp)

SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
PRIMITIVES = {
    "boolean": '("true" | "false")',
    "decimal-part": "[0-9]{1,16}",
    "integral-part": "[0] | [1-9] [0-9]{0,15}",
    "number": '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
    "integer": '("-"? integral-part)',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
    "array": '"[" space ( value ("," space value)* )? space "]"',
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\""'),
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\""',
    "null": '"null"',
    # (a real date: each month its days, February 28; years 1000-9999, as Python's date takes them)
    "date": ('[1-9] [0-9]{3} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] ) | '
             '( "0" [469] | "11" ) "-" ( "0" [1-9] | [1-2] [0-9] | "30" ) | "02" "-" ( "0" [1-9] | "1" [0-9] | '
             '"2" [0-8] ) )'),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) '
             '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'),
    "date-time": 'date "T" time',
    "date-string": '"\\"" date "\\""',
    "time-string": '"\\"" time "\\""',
    "date-time-string": '"\\"" date-time "\\""',
    "email-string": '"\\"" [A-Za-z0-9._%+\\-]+ "@" [A-Za-z0-9\\-]+ ("." [A-Za-z0-9\\-]+)+ "\\""',
}
DEPS = {"number": ("integral-part", "decimal-part"), "integer": ("integral-part",),
        "value": ("object", "array", "string", "number", "boolean", "null"), "object": ("string", "value", "space"),
        "array": ("value", "space"), "string": ("char",), "date-time": ("date", "time"),
        "date-string": ("date",), "time-string": ("time",), "date-time-string": ("date-time",)}
FORMATS = {"date": "date-string", "time": "time-string", "date-time": "date-time-string", "uuid": "uuid",
           "email": "email-string"}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const", "anyOf",
    "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems"}) | ANNOTATIONS
#: the type whose values a keyword constrains
APPLIES = {"minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
           "minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
           "minItems": "array", "maxItems": "array", "prefixItems": "array", "items": "array",
           "properties": "object", "required": "object", "additionalProperties": "object"}
#: a pattern's characters as raw JSON string text: not '"', '\\' or a control character (those need escapes)
SAFE = '[^"\\\\\\x00-\\x1F\\x7F]'


def _lit(text: str) -> str:
    """``text`` as a GBNF literal."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _json(v: Any) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise SchemaError("an enum or const holds a value that is not JSON (or a number that is not finite)") from None


def _digits_range(lo: str, hi: str) -> str:
    """Same-length decimal strings lo <= hi: the GBNF for the numbers between them (leading zeros as given)."""
    if lo == hi:
        return _lit(lo)
    i = 0
    while lo[i] == hi[i]:
        i += 1
    head = _lit(lo[:i]) + " " if i else ""
    a, b, rest = lo[i], hi[i], len(lo) - i - 1
    if rest == 0:
        return head + f"[{a}-{b}]"
    lo_r, hi_r = lo[i + 1:], hi[i + 1:]
    alts = []
    full_lo, full_hi = lo_r == "0" * rest, hi_r == "9" * rest
    first = a if full_lo else chr(ord(a) + 1)
    last = b if full_hi else chr(ord(b) - 1)
    if not full_lo:
        alts.append(f"[{a}] ({_digits_range(lo_r, '9' * rest)})")
    if first <= last:
        alts.append(f"[{first}-{last}] [0-9]{{{rest}}}")
    if not full_hi:
        alts.append(f"[{b}] ({_digits_range('0' * rest, hi_r)})")
    return head + "(" + " | ".join(alts) + ")"


def _natural_range(lo: int, hi: int) -> list[str]:
    """Alternatives for the integers lo..hi (0 <= lo <= hi) written without leading zeros."""
    alts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10 ** n - 1)
        if a <= b:
            alts.append(_digits_range(str(a), str(b)))
    return alts


def int_range(lo: int | None, hi: int | None) -> str:
    """The GBNF for the integers in lo..hi (None: no bound; that side has at most :data:`INT_DIGITS` digits, or
    as many as the other bound)."""
    width = max(INT_DIGITS, len(str(abs(lo))) if lo is not None else 0, len(str(abs(hi))) if hi is not None else 0)
    lo = -(10 ** width - 1) if lo is None else lo
    hi = 10 ** width - 1 if hi is None else hi
    if lo > hi:
        raise SchemaError("minimum is above maximum: no integer fits")
    alts = []
    if lo < 0:
        alts.append('"-" (' + " | ".join(_natural_range(max(1, -hi), -lo)) + ")")
    if hi >= 0:
        alts += _natural_range(max(lo, 0), hi)
    return " | ".join(alts)


class _Regex:
    """A ``pattern`` as GBNF over the raw text of a JSON string (see the module's docstring)."""

    CLASSES: ClassVar[dict[str, str]] = {
        "d": "[0-9]", "w": "[A-Za-z0-9_]", "s": "[ ]", "D": "[^0-9\"\\\\\\x00-\\x1F\\x7F]",
        "W": "[^A-Za-z0-9_\"\\\\\\x00-\\x1F\\x7F]", "S": SAFE.replace("\\x00-\\x1F", "\\x00-\\x20")}

    def __init__(self, pattern: str, where: str) -> None:
        self.p, self.i, self.where = pattern, 0, where

    def err(self, why: str) -> SchemaError:
        return SchemaError(f"{self.where}: the pattern {self.p!r} cannot be enforced ({why})")

    def convert(self) -> str:
        p = self.p
        start = p.startswith("^")
        end = p.endswith("$") and not p.endswith("\\$")
        self.p = p[1 if start else 0: len(p) - 1 if end else len(p)]
        body = self.alternation(0)
        if self.i < len(self.p):
            raise self.err("unbalanced parentheses")
        free = f"({SAFE} | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{{4}}))*"
        return " ".join(x for x in ("" if start else free, f"({body})", "" if end else free) if x)

    def alternation(self, depth: int) -> str:
        if depth > 50:
            raise self.err("nested too deeply")
        alts = [self.sequence(depth)]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            alts.append(self.sequence(depth))
        return " | ".join(a or '""' for a in alts)

    def sequence(self, depth: int) -> str:
        items: list[str] = []
        p = self.p
        while self.i < len(p) and p[self.i] not in "|)":
            c = p[self.i]
            if c == "(":
                self.i += 1
                if p.startswith("?:", self.i):
                    self.i += 2
                elif p.startswith("?", self.i):
                    raise self.err("lookarounds, named groups and flags are not supported")
                inner = self.alternation(depth + 1)
                if self.i >= len(p) or p[self.i] != ")":
                    raise self.err("unbalanced parentheses")
                self.i += 1
                items.append(f"({inner})")
            elif c in "*+?{":
                if not items:
                    raise self.err("nothing to repeat")
                items[-1] = self.quantify(items[-1])
            elif c == ".":
                self.i += 1
                items.append(SAFE)
            elif c == "[":
                items.append(self.char_class())
            elif c in "^$":
                raise self.err("an anchor inside the pattern")
            elif c == "\\":
                items.append(self.escape())
            else:
                self.i += 1
                items.append(self.literal(c))
        return " ".join(items)

    def literal(self, ch: str) -> str:
        if ch == '"':
            return '"\\\\\\""'  # the JSON text \"
        if ch == "\\":
            return '"\\\\\\\\"'
        if ord(ch) < 0x20:
            return _lit(json.dumps(ch)[1:-1])
        return _lit(ch)

    def escape(self) -> str:
        p = self.p
        if self.i + 1 >= len(p):
            raise self.err("a trailing backslash")
        e = p[self.i + 1]
        self.i += 2
        if e in self.CLASSES:
            return self.CLASSES[e]
        simple = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
        if e in simple:
            return self.literal(simple[e])
        if e in "xu":
            n = 2 if e == "x" else 4
            digits = p[self.i:self.i + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.err(f"\\{e} needs {n} hex digits")
            self.i += n
            return self.literal(chr(int(digits, 16)))
        if e.isalnum():
            raise self.err(f"the escape \\{e}")
        return self.literal(e)

    def char_class(self) -> str:
        p = self.p
        self.i += 1
        neg = p.startswith("^", self.i)
        self.i += neg
        chars: list[str] = []
        first = True
        while self.i < len(p) and (p[self.i] != "]" or first):
            first = False
            if p[self.i] == "\\":
                e = p[self.i + 1:self.i + 2]
                if e in ("d", "w", "s"):
                    self.i += 2
                    chars.append({"d": "0-9", "w": "A-Za-z0-9_", "s": " "}[e])
                    continue
                if e in ("n", "t", "r", "f", "v") or e.isalnum():
                    raise self.err(f"the escape \\{e} inside a class")
                self.i += 2
                chars.append("\\-" if e == "-" else self.cls_char(e))  # (an escaped '-' is no range)
            else:
                chars.append(self.cls_char(p[self.i]))
                self.i += 1
        if self.i >= len(p):
            raise self.err("an unterminated class")
        self.i += 1
        body = "".join(chars)
        # only characters a JSON string holds raw: never '"', '\\' or a control character
        if neg:
            return f'[^{body}"\\\\\\x00-\\x1F\\x7F]'
        return self._and_safe(body)

    @staticmethod
    def cls_char(ch: str) -> str:
        if ch in '"\\]':
            return "\\" + ch
        if ch == "^":  # (first in a GBNF class it would negate it)
            return "\\x5E"
        if ord(ch) < 0x20:
            return f"\\x{ord(ch):02X}"
        return ch

    def _and_safe(self, body: str) -> str:
        g = parse_grammar(f"root ::= [{body}]")
        _neg, ranges = g.value[g.kind.index(0)]
        keep = [(max(lo, a), min(hi, b)) for lo, hi in ranges
                for a, b in ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, 0x10FFFF)) if max(lo, a) <= min(hi, b)]
        if not keep:
            raise self.err("a class with no character a JSON string holds unescaped")
        return "[" + "".join(f"\\U{a:08X}" if a == b else f"\\U{a:08X}-\\U{b:08X}" for a, b in keep) + "]"

    def quantify(self, item: str) -> str:
        p = self.p
        c = p[self.i]
        if c in "*+?":
            self.i += 1
            out = f"({item}){c}"
        else:
            close = p.find("}", self.i)
            m = re.fullmatch(r"(\d{1,5})(,(\d{0,5}))?", p[self.i + 1:close]) if close > 0 else None
            if m is None:
                raise self.err("a repetition that is not {m}, {m,} or {m,n}")
            self.i = close + 1
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if lo > MAX_LEN or (hi is not None and (hi > MAX_LEN or hi < lo)):
                raise self.err(f"a repetition beyond {MAX_LEN} or below its minimum")
            out = f"({item}){{{lo},{'' if hi is None else hi}}}" if hi != lo else f"({item}){{{lo}}}"
        if self.i < len(p) and p[self.i] in "?+":  # lazy or possessive: the same strings
            self.i += 1
        return out


class SchemaError(ValueError):
    """A schema (or part of one) this server cannot enforce."""


class _Converter:
    def __init__(self, root: Any, depth: int = 0) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}
        self.depth = depth

    def add(self, name: str, body: str) -> str:
        name = re.sub(r"[^A-Za-z0-9-]+", "-", name) or "r"
        key = name
        n = 0
        while key in self.rules and self.rules[key] != body:
            n += 1
            key = f"{name}{n}"
        self.rules[key] = body
        if len(self.rules) > MAX_RULES:
            raise SchemaError(f"the schema needs more than {MAX_RULES} grammar rules")
        return key

    def prim(self, name: str) -> str:
        if name == "space":
            self.rules["space"] = SPACE
            return name
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for d in DEPS.get(name, ()):
                self.prim(d)
        return name

    def resolve(self, ref: Any, path: str) -> tuple[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"{path}.$ref: only local references (#, #/$defs/NAME, #/definitions/NAME) are "
                              "supported")
        target = self.root
        for part in [p for p in ref[1:].split("/") if p] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(f"{path}.$ref {ref!r} does not point into the schema")
        return ref, target

    def visit(self, s: Any, name: str, path: str) -> str:
        """The rule name for a value of schema ``s``."""
        if s is True or s == {}:
            return self.prim("value")
        if self.depth >= MAX_DEPTH:
            raise SchemaError(f"{path}: nested more than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return self._visit(s, name, path)
        finally:
            self.depth -= 1

    def _visit(self, s: Any, name: str, path: str) -> str:
        if s is False:
            raise SchemaError(f"{path}: false (no value) cannot be generated")
        if not isinstance(s, dict):
            raise SchemaError(f"{path} must be an object")
        bad = sorted(k for k in s if k not in KEYWORDS)
        if bad:
            raise SchemaError(f"{path}: the keyword {bad[0]!r} cannot be enforced")
        if "$ref" in s:
            if len([k for k in s if k not in ANNOTATIONS and k not in ("$defs", "definitions")]) > 1:
                raise SchemaError(f"{path}: $ref beside other keywords cannot be enforced")
            ref, target = self.resolve(s["$ref"], path)
            if ref not in self.refs:
                rname = self.add("ref" + re.sub(r"[^A-Za-z0-9-]+", "-", ref[1:]), "")
                self.refs[ref] = rname
                self.rules[rname] = self.visit(target, rname, f"{path}.$ref")
            return self.refs[ref]
        if "allOf" in s:
            return self.visit(self.merge(s, path), name, path)
        for key in ("anyOf", "oneOf"):
            if key in s:
                alts = s[key]
                if not isinstance(alts, list) or not alts or len(alts) > MAX_NAMES:
                    raise SchemaError(f"{path}.{key} must be a non-empty list of schemas")
                rest = {k: v for k, v in s.items() if k != key and k not in ANNOTATIONS}
                if rest:
                    alts = [{"allOf": [rest, a]} for a in alts]
                if key == "oneOf":
                    self.check_disjoint(alts, path)
                names = [self.visit(a, f"{name}-{i}", f"{path}.{key}[{i}]") for i, a in enumerate(alts)]
                return self.add(name, " | ".join(names))
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else s["enum"]
            if not isinstance(values, list) or not values or len(values) > MAX_NAMES:
                raise SchemaError(f"{path}.enum must be a non-empty list of at most {MAX_NAMES} values")
            return self.add(name, "(" + " | ".join(dict.fromkeys(_lit(_json(v)) for v in values)) + ")")
        kind = s.get("type")
        if kind is None:  # (as llama.cpp: a type's own keywords imply it)
            implied = [t for t in ("object", "array", "string") if any(APPLIES.get(k) == t for k in s)]
            kinds = implied[:1] or [t for t in TYPES if t != "integer"]
        elif isinstance(kind, str):
            kinds = [kind]
        elif isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
            kinds = list(dict.fromkeys(kind))
        else:
            raise SchemaError(f"{path}.type must be a type name or a list of them")
        unknown = next((k for k in kinds if k not in TYPES), None)
        if unknown is not None:
            raise SchemaError(f"{path}.type {unknown!r} is not a JSON Schema type")
        if "number" in kinds and "integer" in kinds:
            kinds.remove("integer")
        if len(kinds) > 1:  # (each type takes its own keywords: the others do not apply to its values)
            names = [self.visit({k: v for k, v in s.items() if APPLIES.get(k, t) in (t, "number" if t == "integer"
                                 else t)} | {"type": t}, f"{name}-{t}", path) for t in kinds]
            return self.add(name, " | ".join(names))
        return self.typed(s, kinds[0], name, path)

    def typed(self, s: dict[str, Any], kind: str, name: str, path: str) -> str:
        if kind in ("boolean", "null"):
            return self.prim(kind)
        if kind == "number":
            return self.number(s, name, path)
        if kind == "integer":
            return self.integer(s, name, path)
        if kind == "string":
            return self.string(s, name, path)
        if kind == "array":
            return self.array(s, name, path)
        return self.obj(s, name, path)

    def number(self, s: dict[str, Any], name: str, path: str) -> str:
        """A number, with a bound at 0 at most (positive, non-negative, negative or non-positive numbers):
        other bounds on a number that need not be an integer are refused."""
        bounds = [k for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") if k in s]
        if not bounds:
            return self.prim("number")
        if len(bounds) > 1 or isinstance(s[bounds[0]], bool) or s[bounds[0]] != 0:
            raise SchemaError(f"{path}: {bounds[0]} cannot be enforced on a number unless it is the only bound "
                              "and 0 (bounds of any size are enforced on integers)")
        self.prim("integral-part")
        exp = '([eE] [-+]? integral-part)?'
        pos = self.add("positive-number", '([1-9] [0-9]{0,15} ("." [0-9]{1,16})? | "0" "." "0"{0,15} [1-9] '
                       f'[0-9]{{0,15}}) {exp}')
        body = {"minimum": f'integral-part ("." [0-9]{{1,16}})? {exp}',
                "exclusiveMinimum": pos, "exclusiveMaximum": f'"-" {pos}',
                "maximum": f'"-" {pos} | "0" ("." "0"{{1,16}})? {exp}'}[bounds[0]]
        return self.add(name, body)

    def integer(self, s: dict[str, Any], name: str, path: str) -> str:
        lo: int | None = None
        hi: int | None = None

        def num(k: str) -> float:
            v = s[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) >= 1e18:
                raise SchemaError(f"{path}.{k} must be a finite number below 1e18")
            return v

        if "minimum" in s:
            lo = math.ceil(num("minimum"))
        if "maximum" in s:
            hi = math.floor(num("maximum"))
        if "exclusiveMinimum" in s:
            v = num("exclusiveMinimum")
            lo = max(lo if lo is not None else -(10 ** 18), math.floor(v) + 1)
        if "exclusiveMaximum" in s:
            v = num("exclusiveMaximum")
            hi = min(hi if hi is not None else 10 ** 18, math.ceil(v) - 1)
        if lo is None and hi is None:
            return self.prim("integer")
        return self.add(name, "(" + int_range(lo, hi) + ")")

    def length(self, s: dict[str, Any], lo_k: str, hi_k: str, path: str) -> tuple[int, int | None]:
        lo, hi = s.get(lo_k, 0), s.get(hi_k)
        for k, v in ((lo_k, lo), (hi_k, hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LEN):
                raise SchemaError(f"{path}.{k} must be an integer in 0..{MAX_LEN}")
        if hi is not None and hi < lo:
            raise SchemaError(f"{path}: {hi_k} is below {lo_k}")
        return lo, hi

    def string(self, s: dict[str, Any], name: str, path: str) -> str:
        given = [k for k in ("pattern", "format") if k in s] + (
            ["minLength/maxLength"] if "minLength" in s or "maxLength" in s else [])
        if len(given) > 1:
            raise SchemaError(f"{path}: {given[0]} together with {given[1]} cannot be enforced")
        if "pattern" in s:
            if not isinstance(s["pattern"], str) or len(s["pattern"]) > 1000:
                raise SchemaError(f"{path}.pattern must be a regular expression of at most 1000 characters")
            return self.add(name, '"\\"" ' + _Regex(s["pattern"], f"{path}.pattern").convert() + ' "\\""')
        if "format" in s:
            f = s["format"]
            if f not in FORMATS:
                raise SchemaError(f"{path}: the format {f!r} cannot be enforced (supported: "
                                  f"{', '.join(sorted(FORMATS))})")
            return self.prim(FORMATS[f])
        lo, hi = self.length(s, "minLength", "maxLength", path)
        if lo == 0 and hi is None:
            return self.prim("string")
        char = self.prim("char")
        rep = f"{char}{{{lo},{'' if hi is None else hi}}}" if hi != lo else f"{char}{{{lo}}}"
        return self.add(name, f'"\\"" {rep} "\\""')

    def array(self, s: dict[str, Any], name: str, path: str) -> str:
        self.prim("space")
        lo, hi = self.length(s, "minItems", "maxItems", path)
        prefix = s.get("prefixItems")
        if isinstance(s.get("items"), list):  # (draft 4's tuples)
            prefix, s = s["items"], {k: v for k, v in s.items() if k != "items"}
        elif isinstance(prefix, dict):  # (as llama.cpp: one schema for every item)
            prefix, s = None, {"items": prefix} | {k: v for k, v in s.items() if k != "prefixItems"}
        if prefix is not None:
            if not isinstance(prefix, list) or len(prefix) > MAX_NAMES:
                raise SchemaError(f"{path}.prefixItems must be a list of schemas")
            if s.get("items", False) is not False or lo > len(prefix) or (hi is not None and hi < len(prefix)):
                raise SchemaError(f"{path}: prefixItems with items or item counts other than its own cannot be "
                                  "enforced")
            parts = [self.visit(x, f"{name}-{i}", f"{path}.prefixItems[{i}]") for i, x in enumerate(prefix)]
            return self.add(name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        item = self.visit(s.get("items", True), f"{name}-item", f"{path}.items")
        if hi == 0:
            return self.add(name, '"[" space "]"')
        more = f'("," space {item})'
        if lo == 0:
            tail = f"{more}*" if hi is None else f"{more}{{0,{hi - 1}}}"
            body = f"({item} {tail})?"
        else:
            tail = f"{more}{{{lo - 1},{'' if hi is None else hi - 1}}}"
            body = f"{item} {tail}"
        return self.add(name, f'"[" space {body} space "]"')

    def obj(self, s: dict[str, Any], name: str, path: str) -> str:
        self.prim("space")
        props = s.get("properties", {})
        if not isinstance(props, dict) or len(props) > MAX_NAMES:
            raise SchemaError(f"{path}.properties must be an object of at most {MAX_NAMES} properties")
        req = s.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise SchemaError(f"{path}.required must be a list of names")
        # (as llama.cpp: without additionalProperties, only the properties named are written)
        add = s.get("additionalProperties", None if props else True)
        missing = [r for r in req if r not in props]
        if missing and add is False:
            raise SchemaError(f"{path}: required {missing[0]!r} is not among the properties")
        props = {**props, **dict.fromkeys(missing, True if add is None else add)}  # (any value: its schema)
        if not props and add is True:
            return self.prim("object")
        kv: dict[str, str] = {}
        for key, sub in props.items():
            value = self.visit(sub, f"{name}-{key}", f"{path}.properties.{key}")
            kv[key] = self.add(f"{name}-{key}-kv", f'{_lit(_json(key))} space ":" space {value}')
        required = [k for k in props if k in req]
        optional = [k for k in props if k not in req]
        if add is not False and add is not None:
            value = self.visit(add, f"{name}-additional-value", f"{path}.additionalProperties")
            key = self.add(f"{name}-additional-k", self.not_strings(list(props))) if props else self.prim("string")
            kv["*"] = self.add(f"{name}-additional-kv", f'{key} ":" space {value}')
            optional.append("*")
        body = '"{" space '
        body += ' "," space '.join(kv[k] for k in required)
        if optional:
            chain = self.optional_chain(kv, optional, name)
            body += f' ( "," space ( {chain} ) )?' if required else f" ( {chain} )?"
        return self.add(name, body + ' space "}"')

    def optional_chain(self, kv: dict[str, str], keys: list[str], name: str) -> str:
        """One or more of ``keys`` in their order, each at most once (``*``: additional properties, any number,
        last): a chain of rules ``R_i ::= kv_i ("," space R_i+1)? | R_i+1``, linear in the number of keys."""
        nxt = ""
        for i in reversed(range(len(keys))):
            k = keys[i]
            head = f'{kv[k]} ( "," space {kv[k]} )*' if k == "*" else kv[k]
            body = f'{head} ( "," space {nxt} )? | {nxt}' if nxt else head
            nxt = self.add(f"{name}-{'additional' if k == '*' else k}-rest", body)
        return nxt

    def not_strings(self, names: list[str]) -> str:
        """A JSON string that is none of ``names`` (an additional property's key), as llama.cpp's trie."""
        char = self.prim("char")
        trie: dict[str, Any] = {}
        for n in names:
            node = trie
            for ch in _json(n)[1:-1]:
                node = node.setdefault(ch, {})
            node[""] = {}

        def visit(node: dict[str, Any]) -> str:
            alts = []
            for ch, child in sorted(node.items()):
                if not ch:
                    continue
                lit = "[" + _Regex.cls_char(ch) + "]"
                sub = {k: v for k, v in child.items()}
                if any(k for k in sub):
                    inner = visit(sub)
                    alts.append(f"{lit} ({inner})" + ("?" if "" not in sub else ""))
                else:
                    alts.append(f"{lit} {char}+")
            rejects = "".join(_Regex.cls_char(ch) for ch in node if ch)
            alts.append(f'[^"{rejects}\\\\\\x00-\\x1F\\x7F] {char}*')
            return " | ".join(alts)

        return f'"\\"" ( {visit(trie)} )? "\\""'

    def merge(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        """``allOf`` as one object schema: the branches' properties and ``required`` together."""
        parts = s["allOf"]
        if not isinstance(parts, list) or not parts or len(parts) > 64:
            raise SchemaError(f"{path}.allOf must be a non-empty list of at most 64 schemas")
        out: dict[str, Any] = {k: v for k, v in s.items() if k != "allOf" and k not in ANNOTATIONS}
        todo = [(p, f"{path}.allOf[{i}]") for i, p in enumerate(parts)]
        seen = 0
        while todo:
            part, where = todo.pop(0)
            seen += 1
            if seen > 256:
                raise SchemaError(f"{path}.allOf nests too many schemas")
            if part is True or part == {}:
                continue
            if not isinstance(part, dict):
                raise SchemaError(f"{where} must be an object")
            if "$ref" in part:
                part = {**{k: v for k, v in part.items() if k != "$ref"}, **self.resolve(part["$ref"], where)[1]}
            if "allOf" in part:
                todo += [(p, f"{where}.allOf[{i}]") for i, p in enumerate(part["allOf"])]
                part = {k: v for k, v in part.items() if k != "allOf"}
            for k, v in part.items():
                if k in ANNOTATIONS or k in ("$defs", "definitions"):
                    continue
                if k == "properties":
                    props = out.setdefault("properties", {})
                    if not isinstance(v, dict):
                        raise SchemaError(f"{where}.properties must be an object")
                    for pk, pv in v.items():
                        if pk in props and props[pk] != pv:
                            raise SchemaError(f"{where}: the property {pk!r} has different schemas in allOf")
                        props[pk] = pv
                elif k == "required":
                    if not isinstance(v, list):
                        raise SchemaError(f"{where}.required must be a list of names")
                    out["required"] = list(dict.fromkeys([*out.get("required", []), *v]))
                elif k in ("enum", "const") and ("enum" in out or "const" in out):
                    have = out.pop("enum", None) or [out.pop("const")]
                    new = v if k == "enum" else [v]
                    if not isinstance(have, list) or not isinstance(new, list):
                        raise SchemaError(f"{where}.enum must be a list of values")
                    both = [x for x in have if _json(x) in {_json(y) for y in new}]
                    if not both:
                        raise SchemaError(f"{where}: the branches of allOf allow no common value")
                    out["enum"] = both
                elif k in out and out[k] != v:
                    raise SchemaError(f"{where}: {k!r} differs between the branches of allOf")
                else:
                    out[k] = v
        return out

    def check_disjoint(self, alts: list[Any], path: str) -> None:
        """``oneOf`` is enforced as ``anyOf`` where no value can match two branches: each pair has different
        JSON types, or both are objects with a required property whose const/enum values differ."""
        sigs = []
        for a in alts:
            a = self.resolve(a["$ref"], path)[1] if isinstance(a, dict) and "$ref" in a else a
            if not isinstance(a, dict):
                raise SchemaError(f"{path}.oneOf: its branches may overlap (use anyOf)")
            t = a.get("type")
            types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
            if "const" in a or "enum" in a:
                vals = [a["const"]] if "const" in a else a.get("enum")
                types = {("lit", _json(v)) for v in vals} if isinstance(vals, list) else None
            elif types is not None and "number" in types:
                types.add("integer")
            tags = {}
            for k, v in (a.get("properties") or {}).items():
                if k in a.get("required", []) and isinstance(v, dict) and ("const" in v or "enum" in v):
                    vals = [v["const"]] if "const" in v else v["enum"]
                    if isinstance(vals, list):
                        tags[k] = {_json(x) for x in vals}
            sigs.append((types, tags))
        for i in range(len(sigs)):
            for j in range(i):
                (ti, gi), (tj, gj) = sigs[i], sigs[j]
                if ti is not None and tj is not None and not self._overlap(ti, tj):
                    continue
                if ti == tj == {"object"} and any(k in gj and not gi[k] & gj[k] for k in gi):
                    continue
                raise SchemaError(f"{path}.oneOf: branches {j} and {i} may both match one value, which cannot be "
                                  "enforced (use anyOf)")

    @staticmethod
    def _overlap(a: set[Any], b: set[Any]) -> bool:
        def kind(x: Any) -> set[str]:
            if isinstance(x, tuple):
                v = json.loads(x[1])
                t = ("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                     else "number" if isinstance(v, float) else "string" if isinstance(v, str)
                     else "array" if isinstance(v, list) else "object")
                return {t, "number"} if t == "integer" else {t}
            return {x}

        if a & b:
            return True
        lits_a = {x for x in a if isinstance(x, tuple)}
        lits_b = {x for x in b if isinstance(x, tuple)}
        if lits_a and lits_b:
            return bool(lits_a & lits_b)
        ka = set().union(*(kind(x) for x in a))
        kb = set().union(*(kind(x) for x in b))
        return bool(ka & kb)

    def grammar(self) -> str:
        root = self.visit(self.root, "root", "schema")
        if root != "root":
            self.rules["root"] = root
        return "\n".join(f"{k} ::= {v}" for k, v in self.rules.items()) + "\n"


def schema_to_gbnf(schema: Any, depth: int = 0) -> str:
    """``schema`` as GBNF text (rule ``root``); :class:`SchemaError` names what cannot be enforced. ``depth``:
    the levels above it (a tool's parameters sit in its call)."""
    try:
        return _Converter(schema, depth).grammar()
    except RecursionError:
        raise SchemaError("the schema is nested too deeply") from None


def _compile(text: str) -> Grammar:
    try:
        return parse_grammar(text, max_text=1 << 22)  # (bounded by its elements and expansions)
    except GrammarError as exc:
        raise SchemaError(f"schema: {exc}") from None


def schema_grammar(schema: Any, depth: int = 0) -> Grammar:
    """``schema`` compiled to a :class:`~.grammar.Grammar`; :class:`SchemaError` when it cannot be enforced (a
    ``$ref`` loop that produces no output is a left recursion, refused too)."""
    return _compile(schema_to_gbnf(schema, depth))


def call_grammar(params: dict[str, Any]) -> Grammar:
    """A tool call among several tools as :func:`~.jsonmode.call_union` writes it (``{"name": "NAME",
    "arguments": ARGS}``, that spacing, ARGS held to the parameters of the tool NAME names), as a grammar."""
    conv = _Converter(True, 1)
    heads = []
    for i, (name, schema) in enumerate(params.items()):
        conv.root, conv.refs = schema, {}
        args = conv.visit(schema, f"call{i}-args", f"{name}.parameters")
        heads.append(_lit(_json(name)[1:-1] + '", "arguments": ') + f" {args}")
    conv.rules["root"] = '"{\\"name\\": \\"" (' + " | ".join(heads) + ') "}"'
    return _compile("\n".join(f"{k} ::= {v}" for k, v in conv.rules.items()) + "\n")
