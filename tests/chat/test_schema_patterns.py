"""Patterns of client schemas (chat/schema_patterns.py): matched in bounded time per check, and
patterns that would unroll without bound refused before they are compiled."""

from __future__ import annotations

import time

import pytest

from dlm_backend.chat.schema import check_schema, validates
from dlm_backend.errors import DLMError


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
