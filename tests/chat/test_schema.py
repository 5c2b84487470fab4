"""Client schemas (chat/schema.py): checked at admission (self-contained, a valid schema, of bounded
size across a request's tools), never fetched, and validated with clean errors. References and
patterns have their own files (test_schema_refs.py, test_schema_patterns.py)."""

from __future__ import annotations

import time

import pytest

from dlm_backend.chat.schema import check_schema, validates
from dlm_backend.chat.tool_calls import normalize_tools
from dlm_backend.errors import DLMError


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


@pytest.mark.parametrize("ref", ["http://169.254.169.254/latest/meta-data", "file:///etc/passwd", "other.json#/a"])
def test_a_reference_outside_the_schema_is_refused_and_never_fetched(ref, monkeypatch):
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail(f"fetched {a}"))
    with pytest.raises(DLMError, match="points outside the schema") as err:
        check_schema({"type": "object", "properties": {"a": {"$ref": ref}}}, where="tools[0]")
    assert err.value.param == "tools[0]"


def test_depth_and_meta_schema_are_checked_at_admission():
    deep: dict = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(DLMError, match="32 levels deep"):
        check_schema(deep)
    with pytest.raises(DLMError, match="not a valid JSON schema"):
        check_schema({"type": "object", "properties": {"a": {"type": "text"}}})
    with pytest.raises(DLMError, match="must be an object, not list"):
        check_schema([{"type": "string"}])
    ok = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]}
    assert check_schema(ok) is ok
    assert validates(ok, {"a": "abc"}) and not validates(ok, {"a": "abcd"}) and not validates(ok, {})
