"""The shipped dlm-tiny: loads through the normal path, is the default, calls tools and fills JSON.
Its held-out figures are the recipe's tests (recipes/dlm_tiny/tests/test_shipped_model.py)."""

import json

import pytest

from dlm_backend import LLM, SamplingParams
from dlm_backend.chat import ChatRequest, complete
from dlm_backend.chat.tool_calls import parse_tool_calls
from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL

GREEDY = SamplingParams(sampler="llada", max_tokens=64, block_length=32, steps=64)
FAST = SamplingParams(sampler="threshold", threshold=0.9, max_tokens=64, block_length=32, cache="dual")


def test_checkpoint_is_small_and_hub_shaped():
    names = {p.name for p in EMBEDDED_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    assert sum(p.stat().st_size for p in EMBEDDED_MODEL.iterdir()) < 40 * 2**20


def test_default_model_is_the_embedded_one():
    llm = LLM()
    assert llm.engine.checkpoint.folder == EMBEDDED_MODEL and llm.engine.architecture == "DreamModel"


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("city", ["Kyoto", "Lisbon"])
def test_tool_call_copies_an_unseen_city(city):
    llm = LLM()
    out = llm.chat([{"role": "user", "content": f"What's the weather in {city}?"}], GREEDY, tools=WEATHER)
    _, calls, bad = parse_tool_calls(out.text)
    assert calls == [{"name": "get_weather", "arguments": {"city": city}}] and not bad, out.text


def test_tool_call_with_fast_decoding():
    llm = LLM()
    out = llm.chat([{"role": "user", "content": "What's the weather in Kyoto?"}], FAST, tools=WEATHER)
    _, calls, bad = parse_tool_calls(out.text)
    assert calls == [{"name": "get_weather", "arguments": {"city": "Kyoto"}}] and not bad
    assert out.num_forward_passes < out.num_generated_tokens


def test_json_schema_output_always_parses_and_matches():
    """The skeleton holds keys and punctuation, so even a model that cannot copy returns valid JSON."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                               "capital": {"type": "boolean"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    llm = LLM()
    for question in ("Describe Kyoto as JSON.", "Give me a city record for Lisbon.", "Oslo, 700000 people, capital"):
        result = complete(llm, ChatRequest([{"role": "user", "content": question}], FAST, response_format=fmt))
        parsed = json.loads(result.content)
        assert parsed == result.parsed and list(parsed) == ["city", "population", "capital"]
        assert isinstance(parsed["city"], str) and isinstance(parsed["population"], int)
        assert isinstance(parsed["capital"], bool)
