"""Structured output (chat/structured.py): which schemas are written key by key, and JSON that is
generated validated against its schema."""

import json

import pytest
from tests.chat.chat_cases import LIST_SCHEMA, PERSON, STOPS_SCHEMA

from dlm_backend import LLM, DLMError, SamplingParams
from dlm_backend.chat import ChatRequest, complete, stream
from dlm_backend.chat.structured import plan_json, templatable


def test_json_skeleton_always_matches_the_schema(dream_chat):
    """Even an untrained model's answer parses and has exactly the schema's keys and types."""
    llm = LLM(str(dream_chat))
    assert templatable(PERSON)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for sampler in ("llada", "threshold"):
        req = ChatRequest([{"role": "user", "content": "Bob is 3."}],
                          SamplingParams(sampler=sampler, max_tokens=96, block_length=16, cache="dual"),
                          response_format=fmt)
        result = complete(llm, req)
        obj = result.parsed
        assert set(obj) == set(PERSON["properties"])
        assert isinstance(obj["name"], str) and isinstance(obj["age"], int)
        assert isinstance(obj["score"], (int, float)) and isinstance(obj["member"], bool)
        assert obj["tier"] in ("gold", "silver")
        assert json.loads(result.content) == obj


def test_which_schemas_are_written_key_by_key(dream_chat):
    tok = LLM(str(dream_chat)).tokenizer
    for schema in (PERSON, LIST_SCHEMA, {"type": "object", "properties": {"p": PERSON, "n": {"type": "null"}}}):
        plan = plan_json(tok, {"type": "json_schema", "json_schema": {"schema": schema}}, 128)
        assert plan.templated and plan.prefix == []
    with pytest.raises(DLMError, match="raise max_tokens"):
        plan_json(tok, {"type": "json_schema", "json_schema": {"schema": PERSON}}, 10)
    generated = plan_json(tok, {"type": "json_schema", "json_schema": {"schema": STOPS_SCHEMA}}, 64)
    assert not generated.templated and tok.decode(generated.prefix) == '{"'


def test_optional_properties_are_templated_as_their_type(dream_chat):
    """pydantic writes Optional[str] as anyOf [string, null]; the skeleton fills it as a string."""
    llm = LLM(str(dream_chat))
    schema = {"type": "object", "properties": {"setup": {"type": "string"},
                                               "rating": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                               "tag": {"type": ["string", "null"]}}}
    assert templatable(schema) and not templatable({"type": "object", "properties": {
        "x": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}})
    fmt = {"type": "json_schema", "json_schema": {"name": "joke", "schema": schema}}
    result = complete(llm, ChatRequest([{"role": "user", "content": "joke"}],
                                       SamplingParams(max_tokens=96, block_length=16), response_format=fmt))
    assert list(result.parsed) == ["setup", "rating", "tag"]
    assert isinstance(result.parsed["rating"], int) and isinstance(result.parsed["tag"], str)
    # streamed, the answer is the JSON read back from the slots, not the raw canvas around them
    deltas = list(stream(llm, ChatRequest([{"role": "user", "content": "joke"}],
                                          SamplingParams(max_tokens=96, block_length=16), response_format=fmt)))
    text = "".join(d.content for d in deltas)
    assert text == deltas[-1].result.content and json.loads(text) == deltas[-1].result.parsed


def test_an_optional_enum_listing_null_is_templated_and_a_mixed_enum_is_validated(dream_chat):
    """OpenAI's structured-output guide writes an optional enum as type [string, null] with null in
    the enum: it read back as a number slot, and float("celsius") was a 500 after generation."""
    llm = LLM(str(dream_chat))
    unit = {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]}
    schema = {"type": "object", "properties": {"unit": unit, "level": {"enum": [1, 2, None]}}}
    assert templatable(schema)
    assert not templatable({"type": "object", "properties": {"x": {"enum": ["a", 1]}}})
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    result = complete(llm, ChatRequest([{"role": "user", "content": "unit?"}],
                                       SamplingParams(max_tokens=96, block_length=16), response_format=fmt))
    assert result.parsed["unit"] in ("celsius", "fahrenheit") and result.parsed["level"] in (1, 2)


def test_json_without_skeleton_is_validated_against_the_schema(dream_chat):
    llm = LLM(str(dream_chat))
    plan = plan_json(llm.tokenizer, {"type": "json_schema", "json_schema": {"name": "l", "schema": STOPS_SCHEMA}}, 32)
    assert not plan.templated
    assert plan.parse('Sure: {"stops": [{"city": "Oslo"}]}') == (
        {"stops": [{"city": "Oslo"}]}, 'Sure: {"stops": [{"city": "Oslo"}]}')
    assert plan.parse('{"stops": "Oslo"}')[0] is None          # parses, misses the schema
    assert plan.parse('{"stops": [')[0] is None
    loose = plan_json(llm.tokenizer, {"type": "json_object"}, 32)
    assert loose.parse('{"any": 1}')[0] == {"any": 1}
    with pytest.raises(DLMError, match="not a valid JSON schema: 'two' is not of type 'integer'"):
        plan_json(llm.tokenizer, {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "array", "minItems": "two"}}}}}, 32)


def test_a_literal_is_written_by_the_skeleton(dream_chat):
    """pydantic writes Literal["person"] as const: it was a free string slot, so it never matched."""
    schema = {"type": "object", "properties": {"kind": {"const": "person", "type": "string"},
                                               "name": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    result = complete(LLM(str(dream_chat)), ChatRequest([{"role": "user", "content": "A person."}],
                                                        SamplingParams(max_tokens=48), response_format=fmt))
    assert result.parsed["kind"] == "person" and set(result.parsed) == {"kind", "name"}
