"""Extract llama.cpp's own grammar test cases into tests/data/llama_grammar_cases.json (the oracle of
tests/test_server_grammar.py).

Source: llama.cpp as vendored by llama-cpp-python 0.3.36 (~/.cache/quantscope/llama.cpp-0.3.36/src/tests, MIT
licence): test-grammar-integration.cpp (``test_grammar`` / ``test_schema``: strings each grammar or schema accepts
and rejects), test-grammar-parser.cpp (grammars that parse, ``verify_parsing``, and that must fail,
``verify_failure``) and test-json-schema-to-grammar.cpp (schemas llama.cpp converts, or refuses, with the grammar
it writes). Cases that use token references (``<[id]>``, ``token(n)``: a model's token ids, not text) are left
out. Strings are stored as text, or as ``{"hex": …}`` where a case holds bytes that are not UTF-8.

Run: ``python tests/record_grammar_cases.py [LLAMA_CPP_TESTS_DIR]``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

DEFAULT = Path.home() / ".cache/quantscope/llama.cpp-0.3.36/src/tests"
OUT = Path(__file__).parent / "data" / "llama_grammar_cases.json"


class Skip(Exception):
    """A case this extraction leaves out (token references)."""


def _string(src: str, i: int) -> tuple[bytes, int]:
    """A C++ string literal at ``src[i]`` (plain or raw ``R"d(...)d"``): its bytes and the index after it."""
    if src.startswith('R"', i):
        j = src.index("(", i)
        delim = src[i + 2:j]
        end = src.index(")" + delim + '"', j)
        return src[j + 1:end].encode(), end + len(delim) + 2
    assert src[i] == '"', src[i:i + 20]
    out = bytearray()
    i += 1
    while src[i] != '"':
        c = src[i]
        if c == "\\":
            e = src[i + 1]
            if e == "x":
                m = re.match(r"[0-9a-fA-F]+", src[i + 2:])
                assert m
                out.append(int(m.group(0), 16) & 0xFF)
                i += 2 + len(m.group(0))
                continue
            if e in "01234567":
                m = re.match(r"[0-7]{1,3}", src[i + 1:])
                assert m
                out.append(int(m.group(0), 8) & 0xFF)
                i += 1 + len(m.group(0))
                continue
            simple = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'", "?": b"?", "0": b"\0",
                      "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v"}
            if e == "u":
                out += chr(int(src[i + 2:i + 6], 16)).encode()
                i += 6
                continue
            out += simple[e]
            i += 2
        else:
            out += c.encode()
            i += 1
    return bytes(out), i + 1


def _skip_space(src: str, i: int) -> int:
    while True:
        while i < len(src) and src[i].isspace():
            i += 1
        if src.startswith("//", i):
            i = src.index("\n", i)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        else:
            return i


def _expr(src: str, i: int) -> tuple[Any, int]:
    """One argument: a string (literals joined by ``+`` or placed side by side), a ``{...}`` list of them, or an
    identifier (SUCCESS / FAILURE)."""
    i = _skip_space(src, i)
    if src[i] == "{":
        items = []
        i = _skip_space(src, i + 1)
        while src[i] != "}":
            v, i = _expr(src, i)
            items.append(v)
            i = _skip_space(src, i)
            if src[i] == ",":
                i = _skip_space(src, i + 1)
        return items, i + 1
    parts: list[bytes] = []
    skip = False
    while True:
        i = _skip_space(src, i)
        if src[i] == '"' or src.startswith('R"', i):
            b, i = _string(src, i)
            parts.append(b)
        elif src.startswith("token(", i) or src.startswith("std::string", i):
            depth, j = 0, i
            while True:
                if src[j] == "(":
                    depth += 1
                elif src[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            skip = skip or src.startswith("token(", i)
            i = j + 1
        elif re.match(r"[A-Za-z_]", src[i]):
            m = re.match(r"[A-Za-z_][A-Za-z_0-9:]*", src[i:])
            assert m
            return m.group(0), i + len(m.group(0))
        else:
            break
        i = _skip_space(src, i)
        if src[i] == "+":
            i += 1
            continue
        if src[i] == '"' or src.startswith('R"', i):
            continue
        break
    if skip:
        return Skip(), i
    return b"".join(parts), i


def _calls(src: str, name: str, nargs: int = 4) -> list[list[Any]]:
    """The first ``nargs`` arguments of every call ``name(...)`` (not the definition)."""
    out = []
    for m in re.finditer(r"(?<![\w:])" + re.escape(name) + r"\(", src):
        line_start = src.rfind("\n", 0, m.start()) + 1
        if "static" in src[line_start:m.start()] or "void" in src[line_start:m.start()]:
            continue
        i = m.end()
        args = []
        i = _skip_space(src, i)
        if src[i] == "{":  # test({...}): one aggregate
            i += 1
        while True:
            v, i = _expr(src, i)
            args.append(v)
            if len(args) == nargs:
                break
            i = _skip_space(src, i)
            if src[i] == ",":
                i += 1
                i = _skip_space(src, i)
                if src[i] in ")}":
                    break
                continue
            break
        out.append(args)
    return out


def _text(b: Any) -> Any:
    if isinstance(b, list):
        return [_text(x) for x in b]
    if not isinstance(b, bytes):
        return b
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def _has_skip(v: Any) -> bool:
    return isinstance(v, Skip) or (isinstance(v, list) and any(_has_skip(x) for x in v))


def record(tests: Path) -> dict[str, Any]:
    integ = (tests / "test-grammar-integration.cpp").read_text()
    cases = []
    for kind in ("test_grammar", "test_schema"):
        for args in _calls(integ, kind):
            desc, body, good, bad = args[:4]
            if _has_skip(args) or b"<[" in body:
                continue
            cases.append({"kind": kind[5:], "name": _text(desc), kind[5:]: _text(body), "accept": _text(good),
                          "reject": _text(bad)})
    parser = (tests / "test-grammar-parser.cpp").read_text()
    parses = [_text(a[0]) for a in _calls(parser, "verify_parsing", 1) if isinstance(a[0], bytes)]
    fails = [_text(a[0]) for a in _calls(parser, "verify_failure", 1) if isinstance(a[0], bytes)]
    conv = (tests / "test-json-schema-to-grammar.cpp").read_text()
    schemas = []
    for args in _calls(conv, "test"):
        if len(args) >= 4 and args[0] in ("SUCCESS", "FAILURE"):
            schemas.append({"status": args[0], "name": _text(args[1]), "schema": _text(args[2]),
                            "grammar": _text(args[3])})
    return {"source": "llama.cpp tests as vendored by llama-cpp-python 0.3.36 (MIT), extracted by "
                      "tests/record_grammar_cases.py",
            "integration": cases, "parser": {"parse": [p for p in parses if "<[" not in str(p)],
                                             "fail": fails},
            "schema_to_grammar": schemas}


if __name__ == "__main__":
    data = record(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(data['integration'])} integration cases, {len(data['parser']['parse'])} + "
          f"{len(data['parser']['fail'])} parser cases, {len(data['schema_to_grammar'])} schemas -> {OUT}")
