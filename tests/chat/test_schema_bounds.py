"""Client schemas at admission and at validation: references resolved as the validator resolves
them, no cycles, and bounded work (regex backtracking, pattern compilation, reference fan-out,
schema size across a request's tools)."""

from __future__ import annotations

import time

import pytest

from dlm_backend.chat.schema import check_schema, validates
from dlm_backend.chat.tool_calls import normalize_tools
from dlm_backend.errors import DLMError

DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"


@pytest.mark.parametrize("schema, says", [
    # resolves from the root but not from its $id: the validator looks in http://x/sub.json
    ({"allOf": [{"$id": "http://x/sub.json", "$ref": "#/$defs/z"}], "$defs": {"z": {"type": "string"}}}, "$id"),
    ({"allOf": [{"$ref": "#"}]}, "refers back to itself"),
    ({"$schema": DRAFT2019, "$recursiveRef": "#"}, "refers back to itself"),
    ({"$schema": DRAFT2019, "$recursiveAnchor": True, "anyOf": [{"$recursiveRef": "#"}]}, "refers back to itself"),
    ({"$dynamicAnchor": "n", "anyOf": [{"$dynamicRef": "#n"}]}, "refers back to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
     "refers back to itself"),
    ({"enum": [{"type": "string"}], "$ref": "#/enum/0"}, "not one of the schema's subschemas"),
    ({"properties": {"a": {"type": "string"}}, "$ref": "#/properties"}, "not one of the schema's subschemas"),
    # 2**24 checks of one value through references that each appear twice
    ({"$defs": {**{f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(24)},
                "d24": {"type": "string"}}, "$ref": "#/$defs/d0"}, "checked over"),
])
def test_references_the_validator_cannot_follow_are_refused_at_admission(schema, says):
    with pytest.raises(DLMError, match="response_format") as err:
        check_schema(schema)
    assert says in str(err.value)


@pytest.mark.parametrize("schema, good, bad", [
    ({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
      "$ref": "#/$defs/node"}, {"next": {"next": {}}}, {"next": 5}),
    ({"allOf": [{"$id": "http://x/sub.json", "$ref": "#/$defs/z", "$defs": {"z": {"type": "string"}}}]}, "a", 5),
    ({"$schema": DRAFT2019, "$recursiveAnchor": True, "type": "object",
      "additionalProperties": {"$recursiveRef": "#"}}, {"a": {"b": {}}}, {"a": 5}),
    ({"$dynamicAnchor": "n", "type": "array", "items": {"$dynamicRef": "#n"}}, [[[]]], [[5]]),
])
def test_recursion_through_the_value_is_admitted_and_validates(schema, good, bad):
    check_schema(schema)
    assert validates(schema, good) and not validates(schema, bad)


def test_a_catastrophic_pattern_is_bounded_per_check_not_per_pattern():
    """The value pinned by enum forces the backtracking: 200 patterns of 50 ms were 10 s a check."""
    value = "a" * 30 + "!"
    schema = {"type": "object", "properties": {"a": {"type": "string", "enum": [value],
                                                     "anyOf": [{"pattern": "^(a|aa)+$"}] * 200}}}
    check_schema(schema)
    t = time.perf_counter()
    with pytest.raises(DLMError, match="took over .* simplify the schema"):
        validates(schema, {"a": value})
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("pattern", ["(?:a{1000}){1000}", "a{100000}", "(x{65535}){65535}", "a{4294967294}"])
def test_patterns_that_unroll_without_bound_are_refused_before_compiling(pattern):
    """regex unrolls a counted repeat's minimum: (a{1000}){1000} took 275 MB, a{4294967294} minutes."""
    t = time.perf_counter()
    with pytest.raises(DLMError, match="repeats too much"):
        check_schema({"type": "string", "pattern": pattern})
    assert time.perf_counter() - t < 0.5
    check_schema({"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$|^.{0,100000}$|^(?:[A-Z]{2}\d{3}){1,9}$"})


def test_a_requests_tools_share_one_schema_budget():
    """20 tools of 1,600 properties were 18 s of schema checks in one request."""
    props = {f"p{i}": {"type": "string"} for i in range(1600)}
    tools = [{"type": "function", "function": {"name": f"t{j}", "parameters": {"type": "object", "properties": props}}}
             for j in range(20)]
    t = time.perf_counter()
    with pytest.raises(DLMError, match="too large"):
        normalize_tools(tools)
    assert time.perf_counter() - t < 2.0
    assert len(normalize_tools(tools[:1])) == 1


def test_validation_errors_are_clean_and_deep_values_are_misses():
    # A schema that skipped admission (a caller of validates directly): a DLMError, not a referencing error.
    with pytest.raises(DLMError, match="does not resolve"):
        validates({"allOf": [{"$id": "http://x/sub.json", "$ref": "#/$defs/z"}], "$defs": {"z": {}}}, "a")
    schema = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    deep: list = []
    for _ in range(5000):                               # deeper than Python's recursion limit
        deep = [deep]
    assert validates(schema, [[]]) and not validates(schema, deep)


def test_property_names_matched_for_additional_properties_are_bounded_too():
    """jsonschema matched patternProperties for additionalProperties on Python's re: no timeout,
    the GIL held (a 37-character key took seconds, each character more 1.6 times as long)."""
    schema = {"type": "object", "patternProperties": {"^(a|aa)+$": {}}, "additionalProperties": False}
    check_schema(schema)
    t = time.perf_counter()
    assert not validates(schema, {"a" * 36 + "!": 1}) and validates(schema, {"aaa": 1})
    assert time.perf_counter() - t < 1.0
    with pytest.raises(DLMError, match="unevaluatedProperties together with patternProperties"):
        check_schema({"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False})
