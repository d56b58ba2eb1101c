"""Structured output, complete (issue 50, item 4): GBNF grammars (core/server/grammar.py) and JSON Schema beyond
the automaton's subset compiled to them (core/server/schema_grammar.py), checked against llama.cpp's own test
cases (tests/data/llama_grammar_cases.json, extracted by tests/record_grammar_cases.py), and end to end with the
real ``openai`` client against a real server, every reply validated with ``jsonschema``."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from quantscope.core.server import Server
from quantscope.core.server.grammar import MAX_STACKS, GrammarError, accepts, parse_grammar
from quantscope.core.server.jsonmode import ANY, SchemaError, can_end, closed, compile_schema, feed, initial
from quantscope.core.server.schema_grammar import int_range, schema_grammar, schema_to_gbnf

from .server_helpers import serving

CASES = json.loads((Path(__file__).parent / "data" / "llama_grammar_cases.json").read_text())
#: where this server knowingly differs from llama.cpp: it refuses what llama.cpp would ignore (a schema is never
#: silently ignored), naming the keyword
REFUSED_HERE = {"required props": "uniqueItems", "unsupported regexp in a property": "pattern"}
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date-time", ValueError)
def _date_time(v: object) -> bool:
    return not isinstance(v, str) or (len(v) > 11 and v[10] in "Tt" and bool(datetime.datetime.fromisoformat(v)))


@FORMATS.checks("time", ValueError)
def _time(v: object) -> bool:
    return not isinstance(v, str) or bool(datetime.time.fromisoformat(v))


def validate(schema: Any, value: Any) -> None:
    jsonschema.Draft202012Validator(schema, format_checker=FORMATS).validate(value)


def raw(s: Any) -> bytes:
    return bytes.fromhex(s["hex"]) if isinstance(s, dict) else s.encode()


def matches(schema: Any, text: bytes) -> bool:
    st = feed(initial(schema), text)
    return st is not None and can_end(st)


# ------------------------------------------------------------------------------------------ llama.cpp's cases
@pytest.mark.parametrize("case", CASES["integration"], ids=lambda c: c["name"])
def test_llama_cpp_integration_cases(case: dict[str, Any]) -> None:
    """test-grammar-integration.cpp: each grammar, and each schema as compiled to a grammar here, accepts and
    rejects exactly the strings llama.cpp's do."""
    if case["kind"] == "grammar":
        g = ("grammar", parse_grammar(case["grammar"]))
    else:
        schema = json.loads(case["schema"])
        if case["name"] in REFUSED_HERE:
            with pytest.raises(SchemaError, match=REFUSED_HERE[case["name"]]):
                compile_schema(schema)
            return
        g = ("grammar", schema_grammar(schema))
    for s in case["accept"]:
        assert matches(g, raw(s)), s
    for s in case["reject"]:
        assert not matches(g, raw(s)), s


@pytest.mark.parametrize("case", [c for c in CASES["integration"] if c["kind"] == "schema"],
                         ids=lambda c: c["name"])
def test_the_servers_schemas_accept_only_valid_documents(case: dict[str, Any]) -> None:
    """The server's path (the automaton for its subset, else the grammar): every string llama.cpp accepts is
    accepted; a string llama.cpp rejects is accepted only where it is valid JSON for the schema (the automaton
    takes any property order and whitespace, and integers of any length)."""
    schema = json.loads(case["schema"])
    if case["name"] in REFUSED_HERE:
        return
    compiled = compile_schema(schema)
    for s in case["accept"]:
        assert matches(compiled, raw(s)), s
    for s in case["reject"]:
        if matches(compiled, raw(s)):
            validate(schema, json.loads(raw(s)))


def test_llama_cpp_parser_cases() -> None:
    """test-grammar-parser.cpp: the grammars it parses parse here; the ones it refuses are refused."""
    for text in CASES["parser"]["parse"]:
        parse_grammar(text)
    for text in CASES["parser"]["fail"]:
        with pytest.raises(GrammarError):
            parse_grammar(text)


@pytest.mark.parametrize("case", CASES["schema_to_grammar"], ids=lambda c: c["name"])
def test_llama_cpp_schema_conversions(case: dict[str, Any]) -> None:
    """test-json-schema-to-grammar.cpp: the grammar llama.cpp writes parses here, and the schema compiles here
    where llama.cpp converts it (refused by name where llama.cpp would silently ignore a keyword), and is refused
    where llama.cpp refuses it."""
    if case["status"] == "SUCCESS":
        parse_grammar(case["grammar"])
    try:
        schema = json.loads(case["schema"])
    except ValueError:
        assert case["status"] == "FAILURE"
        return
    if case["status"] == "FAILURE":
        with pytest.raises(SchemaError):
            compile_schema(schema)
    elif case["name"] in REFUSED_HERE:
        with pytest.raises(SchemaError, match=REFUSED_HERE[case["name"]]):
            compile_schema(schema)
    else:
        compile_schema(schema)


# ------------------------------------------------------------------------------------------------ the grammar
def test_grammar_syntax_and_utf8() -> None:
    g = parse_grammar('root ::= "é" [α-ω]+ "\\u00e9" # comment\n')
    assert accepts(g, "éαβωé") and not accepts(g, "éé") and not accepts(g, "eαé")
    g = parse_grammar("root ::= [^a]")
    assert accepts(g, "b") and accepts(g, "😀") and not accepts(g, "a")
    for bad in (b"\xc0\x80", b"\xed\xa0\x80", b"\xff", b"\x80", b"\xf4\x90\x80\x80"):  # overlong, surrogate, ...
        assert not accepts(g, bad), bad
    assert feed(initial(("grammar", g)), "😀".encode()[:2]) is not None  # a character's first bytes
    g = parse_grammar('root ::= "a"{2,3} ("b" | "c"){0,2} x\nx ::= "z"?')
    assert [accepts(g, s) for s in ("aa", "aaabcz", "aaaa", "abz", "aabcb")] == [True, True, False, False, False]


def test_strings_are_utf8_as_python_decodes_it() -> None:
    """The automaton's strings and a grammar's classes take a byte sequence exactly when it is UTF-8 (no overlong
    forms, surrogates or code points beyond U+10FFFF): every 1- and 2-byte sequence, and 3- and 4-byte ones around
    the edges."""
    import random

    g = ("grammar", parse_grammar(r'root ::= "\"" [^"\\]* "\""'))
    rng = random.Random(1)
    seqs = [bytes([a]) for a in range(0x80, 256)] + [bytes([a, b]) for a in range(0xC0, 256) for b in range(0x70, 0xD0)]
    seqs += [bytes([rng.choice([0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF4, 0xF5]), *(rng.randrange(0x70, 0xD0)
                    for _ in range(rng.choice([2, 3])))]) for _ in range(3000)]
    for b in seqs:
        try:
            b.decode("utf-8")
            utf8 = True
        except UnicodeDecodeError:
            utf8 = False
        assert matches(ANY, b'"' + b + b'"') == utf8 == matches(g, b'"' + b + b'"'), b.hex()


@pytest.mark.parametrize(("text", "word"), [
    ('root ::= "a" | root "a"', "left-recursive"),
    ('root ::= x\nx ::= y x "b" | "a"\ny ::= "" |', "left-recursive"),
    ("root ::= undefined", "not defined"), ('rot ::= "a"', "root"), ('root ::= "a"{5000}', "repetitions"),
    ('root ::= "a" <[12]>', "token"), ('root ::= "\\q"', "escape"), ("root ::= [a", "end"),
    ('root ::= "a"' + " " * (1 << 17), "longer"), ('root ::= ((("a"{0,1000}){0,1000}){0,1000})', "repetitions"),
    ("x" * 10, "::="), (None, "text"),
])
def test_hostile_grammars_are_refused(text: Any, word: str) -> None:
    with pytest.raises(GrammarError, match=word):
        parse_grammar(text)


def _calls_while(fn: Any) -> int:
    n = 0

    def prof(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event in ("call", "c_call"):
            n += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def test_an_ambiguous_grammar_costs_bounded_work_per_byte() -> None:
    """Exponentially many parses (every split of a run of a's): a state keeps at most MAX_STACKS of them, so a
    byte costs bounded work; the output stays within the grammar."""
    g = parse_grammar('root ::= x* "b"\nx ::= "a" | "a" "a" | "a" "a" "a" | y\ny ::= "a" y "a" | "a"')
    st = feed(initial(("grammar", g)), b"a" * 40)
    assert st is not None and len(st[1]) <= MAX_STACKS
    calls = _calls_while(lambda: feed(st, b"a" * 10))
    assert calls < 10 * 40 * MAX_STACKS, calls
    assert accepts(g, "a" * 7 + "b")


def test_nesting_is_bounded_by_the_stack() -> None:
    g = parse_grammar('root ::= "(" root ")" | "x"')
    assert accepts(g, "(" * 500 + "x" + ")" * 500)
    assert feed(initial(("grammar", g)), b"(" * 1100) is None  # deeper than MAX_STACK positions: refused


# -------------------------------------------------------------------------------------------------- schemas
ADDRESS = {
    "$defs": {"street": {"type": "string", "minLength": 2, "maxLength": 30},
              "node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": -5, "maximum": 300},
                                                         "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                                            {"type": "null"}]}},
                       "required": ["v", "next"], "additionalProperties": False}},
    "type": "object",
    "properties": {
        "street": {"$ref": "#/$defs/street"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
        "when": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
        "kind": {"oneOf": [{"const": "home"}, {"const": "work"}, {"type": "integer", "exclusiveMinimum": 0}]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
        "chain": {"$ref": "#/$defs/node"},
        "extra": {"allOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
                            {"properties": {"y": {"type": "number", "minimum": 0}}}]},
    },
    "required": ["street", "zip", "kind", "tags"],
}

GOOD = ['{"street": "Main", "zip": "12345", "kind": "home", "tags": ["a"]}',
        '{"street": "Main", "zip": "12345-6789", "kind": 7, "tags": ["a", "b", "a"], "when": "2024-02-28", '
        '"id": "123e4567-e89b-12d3-a456-426614174000", "chain": {"v": -5, "next": {"v": 300, "next": null}}, '
        '"extra": {"x": true, "y": 0.5}}']
BAD = ['{"street": "M", "zip": "12345", "kind": "home", "tags": ["a"]}',  # minLength
       '{"street": "Main", "zip": "1234", "kind": "home", "tags": ["a"]}',  # pattern
       '{"street": "Main", "zip": "12345", "kind": 0, "tags": ["a"]}',  # exclusiveMinimum
       '{"street": "Main", "zip": "12345", "kind": "home", "tags": []}',  # minItems
       '{"street": "Main", "zip": "12345", "kind": "home", "tags": ["a", "a", "a", "a"]}',  # maxItems
       '{"street": "Main", "zip": "12345", "kind": "home", "tags": ["a"], "when": "2024-02-30"}',  # a real date
       '{"street": "Main", "zip": "12345", "kind": "home", "tags": ["a"], "chain": {"v": 301, "next": null}}',
       '{"street": "Main", "zip": "12345", "kind": "home", "tags": ["a"], "extra": {"y": 1}}',  # allOf required x
       '{"street": "Main", "zip": "12345", "kind": "home", "tags": ["a"], "extra": {"x": true, "y": -1}}']


def test_a_schema_with_every_feature_is_enforced() -> None:
    s = compile_schema(ADDRESS)
    assert s[0] == "grammar"
    for text in GOOD:
        assert matches(s, text.encode()), text
        validate(ADDRESS, json.loads(text))
    for text in BAD:
        assert not matches(s, text.encode()), text
        with pytest.raises(jsonschema.ValidationError):
            validate(ADDRESS, json.loads(text))
    assert closed(feed(initial(s), GOOD[0].encode()))


@pytest.mark.parametrize(("lo", "hi"), [(0, None), (2, None), (-123, None), (None, 9999), (None, -3), (-7, 12),
                                        (456, 8000), (-300, -40), (0, 0), (99, 1000)])
def test_integer_ranges_hold_exactly_their_integers(lo: int | None, hi: int | None) -> None:
    g = parse_grammar("root ::= " + int_range(lo, hi))
    for v in range(-1100, 10100, 7):
        assert accepts(g, str(v)) == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    assert not accepts(g, "-0") and not accepts(g, "01")


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    ("^\\d{3}-\\w+$", ["123-ab_c"], ["12-a", "123-"]), ("ab|cd", ["xxabyy", "cd"], ["ac"]),
    ("^(?:a|b)+c?$", ["abab", "bc"], ["c", "abd"]), ("^[^a-c]x$", ["dx", "éx"], ["ax", '"x']),
    ('^say "hi"\\.$', ['say \\"hi\\".'], ['say "hi".', "say \\\"hi\\\"x"]),
    ("^[\\^a][a\\-c]\\n$", ["^-\\n", "aa\\n"], ["bb\\n", "^b\\n", "^-"]),
])
def test_patterns(pattern: str, good: list[str], bad: list[str]) -> None:
    """The raw text between the quotes: a pattern's '"' is written escaped, its classes never take '"', '\\' or
    a control character, so every output is a JSON string whose value matches the pattern."""
    s = compile_schema({"type": "string", "pattern": pattern})
    for text in good:
        assert matches(s, f'"{text}"'.encode()), text
        validate({"type": "string", "pattern": pattern}, json.loads(f'"{text}"'))
    for text in bad:
        assert not matches(s, f'"{text}"'.encode()), text


def test_number_bounds_at_zero() -> None:
    pos = compile_schema({"type": "number", "exclusiveMinimum": 0})
    assert all(matches(pos, t.encode()) for t in ("1", "0.5", "0.01e-3", "12.0E5"))
    assert not any(matches(pos, t.encode()) for t in ("0", "0.0", "-1", "0e5"))
    nonpos = compile_schema({"type": "number", "maximum": 0})
    assert all(matches(nonpos, t.encode()) for t in ("0", "-0.5", "0.00"))
    assert not matches(nonpos, b"0.1")


def test_the_grammar_path_keeps_the_depth_limit() -> None:
    deep: dict[str, Any] = {"type": "string", "minLength": 1}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="nested"):
        compile_schema(deep)
    # a $ref loop that writes nothing expands to finitely many stacks: it is kept (only null can be written)
    loop = compile_schema({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})
    assert matches(loop, b"null") and not matches(loop, b"1")


def test_schema_text_is_a_grammar_llama_cpp_would_read() -> None:
    text = schema_to_gbnf(ADDRESS)
    assert text.startswith("space ::= ") or "root ::=" in text
    parse_grammar(text)


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    with serving(model_path("qwen2.5-coder"), n_ctx=1024, parallel=1) as srv:
        yield srv


class Client(openai.OpenAI):
    model: str


@pytest.fixture
def client(server: Server) -> Client:
    c = Client(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    c.model = c.models.list().data[0].id
    return c


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20},
    "born": {"type": "string", "format": "date"},
    "email": {"type": "string", "format": "email"},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"anyOf": [{"enum": ["admin", "user"]}, {"type": "null"}]},
    "skills": {"type": "array", "items": {"$ref": "#/$defs/skill"}, "minItems": 1, "maxItems": 2}},
    "required": ["name", "born", "email", "age", "role", "skills"], "additionalProperties": False,
    "$defs": {"skill": {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{2,8}$"},
                                                         "level": {"type": "integer", "minimum": 1, "maximum": 5}},
                        "required": ["name", "level"], "additionalProperties": False}}}


def test_json_schema_replies_validate(client: Client) -> None:
    """response_format json_schema with $ref, anyOf, pattern, format and bounds, streamed and not: each reply
    parses and validates with jsonschema, and ends as soon as its object closes."""
    msgs = [{"role": "user", "content": "Invent a person and describe them as JSON."}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = client.chat.completions.create(model=client.model, messages=msgs, max_tokens=200, temperature=0,
                                       response_format=rf)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "stop"
    validate(PERSON, json.loads(r.choices[0].message.content or ""))
    parts = [ch.delta.content or "" for c in client.chat.completions.create(
        model=client.model, messages=msgs, max_tokens=200, temperature=0.9, seed=5, stream=True,
        response_format=rf) for ch in c.choices]  # type: ignore[call-overload]
    validate(PERSON, json.loads("".join(parts)))


def test_grammar_field(client: Client) -> None:
    """llama-server's ``grammar`` body field (GBNF), through the openai client's extra_body, on both endpoints."""
    gbnf = 'root ::= "The answer is " [0-9]{1,3} ("." | "!")'
    r = client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "What is 6 times 7?"}],
                                       max_tokens=20, temperature=0, extra_body={"grammar": gbnf})
    text = r.choices[0].message.content or ""
    assert accepts(parse_grammar(gbnf), text) and r.choices[0].finish_reason == "stop", text
    c = client.completions.create(model=client.model, prompt="Colours: ", max_tokens=30, temperature=0,
                                  extra_body={"grammar": 'root ::= ("red" | "green" | "blue") (", " ("red" | '
                                                         '"green" | "blue")){2}'})
    assert accepts(parse_grammar('root ::= ("red" | "green" | "blue") (", " ("red" | "green" | "blue")){2}'),
                   c.choices[0].text), c.choices[0].text
    s = client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "Give a point"}],
                                       max_tokens=60, temperature=0,
                                       extra_body={"json_schema": {"type": "array", "prefixItems": [
                                           {"type": "integer", "minimum": 1}, {"type": "integer", "maximum": -1}]}})
    v = json.loads(s.choices[0].message.content or "")
    assert len(v) == 2 and v[0] >= 1 and v[1] <= -1


def test_refusals_name_what_cannot_be_enforced(client: Client) -> None:
    msgs = [{"role": "user", "content": "x"}]
    for body, word in ((dict(response_format={"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "array", "uniqueItems": True}}}), "uniqueItems"),
            (dict(extra_body={"grammar": 'root ::= "a" | root "b"'}), "left-recursive"),
            (dict(extra_body={"grammar": "root ::= nothing"}), "nothing"),
            (dict(extra_body={"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}), "both"),
            (dict(extra_body={"json_schema": {"type": "string", "format": "hostname"}}), "hostname"),
            (dict(extra_body={"grammar": 'root ::= "a"' + " " * 200_000}), "longer"),
            (dict(extra_body={"grammar": "root ::= " + "(" * 500 + '"a"' + ")" * 500}), "nested")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=client.model, messages=msgs, **body)  # type: ignore[call-overload]
        assert word in exc.value.message


def test_a_required_tool_call_with_rich_parameters(client: Client) -> None:
    """tool_choice required with parameters beyond the automaton's subset: the call's arguments validate."""
    params = {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"oneOf": [{"const": "C"}, {"const": "F"}]}}, "required": ["city", "days", "unit"]}
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": params}},
             {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
    ask = [{"role": "user", "content": "Weather in Paris for the next 3 days?"}]
    r = client.chat.completions.create(
        model=client.model, messages=ask, tools=tools,
        tool_choice={"type": "function", "function": {"name": "forecast"}}, max_tokens=80,
        temperature=0)  # type: ignore[arg-type]
    call = (r.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "forecast"  # type: ignore[union-attr]
    validate(params, json.loads(call.function.arguments))  # type: ignore[union-attr]
    r = client.chat.completions.create(
        model=client.model, messages=ask, tools=tools,
        tool_choice="required", max_tokens=80, temperature=0)  # type: ignore[arg-type]
    call = (r.choices[0].message.tool_calls or [])[0]
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    validate(params if call.function.name == "forecast" else {"type": "object"}, args)  # type: ignore[union-attr]


WALKED = [ADDRESS, PERSON,
          {"type": "array", "prefixItems": [{"type": "integer", "minimum": -20, "maximum": 20},
                                            {"type": "string", "pattern": "^(ab|c[de]+)?x{1,3}$"},
                                            {"type": "number", "exclusiveMaximum": 0}]},
          {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "boolean"}},
          {"anyOf": [{"type": "string", "format": "time"}, {"type": "string", "format": "date-time"},
                     {"type": "string", "format": "email"}, {"type": ["integer", "null"], "maximum": 3}]},
          {"type": "string", "minLength": 3, "maxLength": 5},
          {"type": "string", "pattern": "[^a-z]{2}\\d"}]


def _walk(schema: Any, rng: Any, limit: int = 300) -> bytes | None:
    """A random output the schema's compiled form allows (closers weighted up so walks end), or None."""
    st = initial(schema)
    out = bytearray()
    for _ in range(limit):
        if can_end(st) and (closed(st) or rng.random() < 0.3):
            return bytes(out)
        choices = [c for c in range(256) if feed(st, bytes((c,))) is not None]
        if not choices:
            return None
        weights = [8.0 if c in b'"}]' else 1.0 if c < 128 else 0.02 for c in choices]
        c = rng.choices(choices, weights)[0]
        out.append(c)
        st = feed(st, bytes((c,)))
    return None


@pytest.mark.parametrize("schema", WALKED, ids=range(len(WALKED)))
def test_every_walk_through_a_schema_validates(schema: Any) -> None:
    """Soundness: random outputs the compiled schema allows all parse and validate with jsonschema."""
    import random

    rng = random.Random(7)
    compiled = compile_schema(schema)
    done = 0
    for _ in range(60):
        text = _walk(compiled, rng)
        if text is not None:
            validate(schema, json.loads(text))
            done += 1
    assert done >= 10, done


def test_remembered_steps_are_bounded() -> None:
    """A grammar remembers the steps it took (states recur in JSON), at most MEMO of them and MEMO_STACKS stacks in
    all, however many parses a hostile grammar keeps."""
    from quantscope.core.server import grammar

    g = parse_grammar("root ::= " + " | ".join(f'"{i:04d}" [a-z]*' for i in range(1000)))
    st = feed(initial(("grammar", g)), b"0")
    for c in range(256):
        feed(st, bytes((c,)))
    for i in range(3000):
        feed(initial(("grammar", g)), f"{i % 1000:04d}".encode() + b"abc" * (i % 7))
    assert len(g.memo) <= grammar.MEMO and g.memo_stacks <= grammar.MEMO_STACKS
    assert accepts(g, "0999xyz") and not accepts(g, "1000")
