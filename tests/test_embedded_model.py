"""The shipped dlm-tiny: loads through the normal path, is the default, answers held-out prompts."""

import json

import pytest

from dlm_backend import LLM, SamplingParams
from dlm_backend.chat import ChatRequest, complete
from dlm_backend.chat.tool_calls import parse_tool_calls
from dlm_backend.training.corpus import NOT_IN_CONTEXT
from dlm_backend.engine.loader import EMBEDDED_MODEL
from dlm_backend.training.evaluate import default_configs, evaluate, held_out, score

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


def test_answers_held_out_chat_prompts():
    llm = LLM()
    examples = [e for e in held_out(8) if e.family == "chat"]
    outputs = llm.generate(prompt_token_ids=[llm.encode_chat(e.messages, tools=e.tools) for e in examples],
                           sampling_params=GREEDY)
    scores = [score(e, o.text)["exact"] for e, o in zip(examples, outputs)]
    assert sum(scores) >= len(examples) // 2, [(e.target, o.text) for e, o in zip(examples, outputs)]


# QA and tool calls pass since the bigram copy circuit, JSON values and tool-result
# sentences since the pointer head (held-out 86% and 90% exact, 50 per family).
@pytest.mark.parametrize("family", ["qa", "tool_call", "json", "tool_result"])
def test_answers_held_out_prompts(family):
    llm = LLM()
    examples = [e for e in held_out(8) if e.family == family][:4]
    outputs = llm.generate(prompt_token_ids=[llm.encode_chat(e.messages, tools=e.tools) for e in examples],
                           sampling_params=GREEDY)
    scores = [score(e, o.text)["exact"] for e, o in zip(examples, outputs)]
    assert sum(scores) >= 3, [(e.target, o.text) for e, o in zip(examples, outputs)]



def test_says_so_when_the_answer_is_not_in_the_context():
    """RAG's other half: no made-up answer. The 10 held-out questions (of 200) about an attribute
    nobody in the context has; the shipped model refuses 9 at its defaults, as s6 did before it
    (s5, shipped before s6, refused 5)."""
    llm = LLM()
    examples = [e for e in held_out(200) if e.family == "qa" and e.target == NOT_IN_CONTEXT
                and not e.expected["distractor"]]
    outputs = llm.generate(prompt_token_ids=[llm.encode_chat(e.messages) for e in examples])
    refused = [o.text.strip() == NOT_IN_CONTEXT for o in outputs]
    assert len(examples) == 10 and sum(refused) >= 6, [o.text for o in outputs]


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


def test_eval_on_a_slice_fast_sampler_needs_fewer_passes():
    """`dlm eval` on the shipped model: threshold+dual at least 2x fewer passes per token than llada."""
    configs = [c for c in default_configs() if c.label in ("llada 1 tok/step, dual", "threshold 0.9, dual")]
    rows = {(r["config"], r["family"]): r for r in evaluate(per_family=2, configs=configs)}
    slow, fast = rows["llada 1 tok/step, dual", "all"], rows["threshold 0.9, dual", "all"]
    assert fast["passes_per_token"] * 2 < slow["passes_per_token"]
    assert rows["threshold 0.9, dual", "chat"]["exact"] >= 0.5
