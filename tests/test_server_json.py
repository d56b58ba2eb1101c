"""JSON output by constrained sampling (core/server/jsonmode.py): the automaton on its own, and the server's
``response_format`` with the real openai client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from quantscope.core.server.jsonmode import (
    ANY,
    ANY_OBJECT,
    SchemaError,
    can_end,
    closed,
    compile_schema,
    feed,
    initial,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "colour": {"enum": ["red", "green", 7]}},
          "required": ["name", "age"], "additionalProperties": False}


def valid(schema: Any, text: str) -> bool:
    st = feed(initial(schema), text.encode())
    return st is not None and can_end(st)


def prefix(schema: Any, text: str) -> bool:
    return feed(initial(schema), text.encode()) is not None


@pytest.mark.parametrize("text", ['{}', '{"a": 1}', ' {"a": [1, -2.5e+3, true, false, null, "x\\n\\u00e9"]} ',
                                  '{"a":{"b":{"c":[]}}}', '{"\\"q": "é"}'])
def test_any_object_accepts_json_objects(text: str) -> None:
    assert valid(ANY_OBJECT, text)
    json.loads(text)


@pytest.mark.parametrize("text", ['[1]', '"x"', '{"a" 1}', '{"a": 01}', '{"a":1,}', '{a: 1}', '{"a": tru}',
                                  '{"a": 1.}', '{"a": "\\x"}', '{"a": "\x01"}', '{"a": 1}}', '{"a": -}'])
def test_any_object_refuses_what_is_not_one(text: str) -> None:
    assert not valid(ANY_OBJECT, text)


def test_numbers_end_where_the_value_does() -> None:
    assert valid(ANY, "12") and valid(ANY, "-0.5E-7") and not valid(ANY, "1e") and not valid(ANY, "-")
    assert not closed(feed(initial(ANY), b"12"))  # a number may go on: only the end of output ends it
    assert closed(feed(initial(ANY), b'"done"')) and closed(feed(initial(ANY), b"[1, 2]"))
    integer = compile_schema({"type": "integer"})
    assert valid(integer, "-42") and not prefix(integer, "4.") and not prefix(integer, "4e")


def test_a_schema_is_enforced() -> None:
    s = compile_schema(PERSON)
    assert valid(s, '{"name": "Bo", "age": 3, "colour": "red"}') and valid(s, '{"age":3,"name":"x","colour":7}')
    assert not valid(s, '{"name": "Bo"}')  # required age missing
    assert not prefix(s, '{"name": "Bo", "age": 3.5')  # not an integer
    assert not prefix(s, '{"nam":')  # not a property, and none may be added
    assert not prefix(s, '{"colour": "blue"')  # not in the enum
    assert not prefix(s, '{"age": 3, "age"')  # a key given twice
    assert not prefix(s, '{"name": "a", "age": 1, "colour": 7,')  # no property left to add
    st = feed(initial(s), b'{"name": "Bo", "age": 3}')
    assert st is not None and closed(st)
    typed = compile_schema({"type": ["string", "null"]})
    assert valid(typed, "null") and valid(typed, '"x"') and not prefix(typed, "1")
    extra = compile_schema({"type": "object", "additionalProperties": {"type": "boolean"}})
    assert valid(extra, '{"x": true}') and not prefix(extra, '{"x": 1')


def test_whitespace_runs_are_bounded() -> None:
    assert prefix(ANY_OBJECT, "{" + " " * 64) and not prefix(ANY_OBJECT, "{" + " " * 65)


@pytest.mark.parametrize(("schema", "word"), [
    ({"type": "string", "pattern": "^(?=a)"}, "pattern"), ({"anyOf": []}, "anyOf"),
    ({"$ref": "#/$defs/x"}, "$ref"), ({"type": "string", "format": "hostname"}, "format"),
    ({"type": "number", "minimum": 1}, "minimum"), ({"type": "thing"}, "thing"), ({"enum": []}, "enum"),
    ({"properties": {"a": {"uniqueItems": True}}}, "uniqueItems"), ([1], "must be an object"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"), ({"not": {"type": "null"}}, "not"),
    ({"type": "object", "minProperties": 1}, "minProperties"), ({"$ref": "https://x/y.json"}, "local"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"), ({"multipleOf": 2}, "multipleOf"),
    ({"type": "object", "required": ["b"], "additionalProperties": False}, "'b'"),
])
def test_schemas_that_cannot_be_enforced_are_refused(schema: Any, word: str) -> None:
    with pytest.raises(SchemaError, match=word.replace("$", r"\$")):
        compile_schema(schema)


def test_deep_schemas_are_refused() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="nested"):
        compile_schema(deep)
