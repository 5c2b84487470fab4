"""Structured output written a value at a time (chat/json_writer.py), checked with a scripted model:
whatever the model writes for a value (any type, 1 to 100+ tokens, escapes, unicode, 10-digit
numbers) comes back exactly, through the engine's real loop, on both test tokenizers."""

import json

import pytest
from tests import scripted_model
from tests.scripted_model import write_scripted_checkpoint

from dlm_backend import LLM, SamplingParams
from dlm_backend.chat import ChatRequest, complete, stream
from dlm_backend.chat.json_writer import STRING_CHUNK
from dlm_backend.plugins import load_plugins

MARKERS = {"dream": "<|im_start|>assistant\n", "llada": "<|start_header_id|>assistant<|end_header_id|>\n\n"}
LONG = "The quick brown fox jumps over the lazy dog, " * 9             # > 64 tokens: the value grows
VALUES = {
    "one": "a", "word": "Paris", "long": LONG.strip(), "quote": 'she said "hi" \\o/', "lines": "a\nb\tc",
    "unicode": "Zürich – 東京 ✓", "empty": "",
    "int": 1234567890, "neg": -42, "zero": 0, "float": 3.25, "exp": 1.5e-07, "big": 98765432109876,
    "yes": True, "no": False, "nothing": None, "tier": "silver", "level": 2, "kind": "person",
    "nested": {"city": "Oslo", "pop": 709037, "tags": ["north", "fjord"]}, "scores": [1, 2.5, -3],
    "names": ["Ana", "Bo"], "flags": [],
}
SCHEMA = {"type": "object", "properties": {
    **{k: {"type": "string"} for k in ("one", "word", "long", "quote", "lines", "unicode", "empty")},
    "int": {"type": "integer"}, "neg": {"type": "integer"}, "zero": {"type": "integer"},
    "float": {"type": "number"}, "exp": {"type": "number"}, "big": {"type": "integer"},
    "yes": {"type": "boolean"}, "no": {"type": "boolean"}, "nothing": {"type": "null"},
    "tier": {"enum": ["gold", "silver"]}, "level": {"enum": [1, 2, 3]}, "kind": {"const": "person"},
    "nested": {"type": "object", "properties": {"city": {"type": "string"}, "pop": {"type": "integer"},
                                                "tags": {"type": "array", "items": {"type": "string"}}}},
    "scores": {"type": "array", "items": {"type": "number"}}, "names": {"type": "array", "items": {"type": "string"}},
    "flags": {"type": "array", "items": {"type": "boolean"}}}}


@pytest.fixture(autouse=True)
def scripted():
    pm = load_plugins()
    pm.register(scripted_model, name="scripted-model")
    yield
    pm.unregister(name="scripted-model")


def scripted_llm(tmp_path, chat_folder, family, answer) -> LLM:
    text = json.dumps(answer, ensure_ascii=False)
    return LLM(str(write_scripted_checkpoint(tmp_path / family, chat_folder, text, MARKERS[family])))


@pytest.mark.parametrize("sampler", ["llada", "threshold"])
@pytest.mark.parametrize("family", ["dream", "llada"])
def test_every_value_comes_back_exactly(tmp_path, dream_chat, llada_chat, family, sampler):
    llm = scripted_llm(tmp_path, {"dream": dream_chat, "llada": llada_chat}[family], family, VALUES)
    tok = llm.tokenizer
    assert len(tok.encode(VALUES["long"])) > 2 * STRING_CHUNK and len(tok.encode(str(VALUES["int"]))) >= 4
    params = SamplingParams(sampler=sampler, max_tokens=1024, block_length=8, cache="none", threshold=0.9)
    fmt = {"type": "json_schema", "json_schema": {"name": "all", "schema": SCHEMA}}
    request = ChatRequest([{"role": "user", "content": "Everything."}], params, response_format=fmt)
    result = complete(llm, request)
    assert result.parsed == VALUES and json.loads(result.content) == VALUES
    assert result.content == json.dumps(VALUES, ensure_ascii=False)
    # Streamed, the JSON goes out as it is written: every delta extends a prefix of the answer.
    deltas = list(stream(llm, request))
    pieces = [d.content for d in deltas if d.content]
    assert len(pieces) > len(VALUES) // 2 and "".join(pieces) == result.content
    assert deltas[-1].result.parsed == VALUES


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_a_forced_call_gets_its_arguments_exactly(tmp_path, dream_chat, llada_chat, family):
    args = {"city": "São Paulo", "days": 1234567890, "units": "metric", "detailed": True}
    call = '<tool_call>\n{"name": "forecast", "arguments": ' + json.dumps(args, ensure_ascii=False) + "}\n</tool_call>"
    llm = LLM(str(write_scripted_checkpoint(tmp_path / family, {"dream": dream_chat, "llada": llada_chat}[family],
                                            call, MARKERS[family])))
    tool = {"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["metric", "imperial"]},
        "detailed": {"type": "boolean"}}}}}
    params = SamplingParams(sampler="llada", max_tokens=128, block_length=8, cache="none")
    result = complete(llm, ChatRequest([{"role": "user", "content": "Weather?"}], params, tools=[tool],
                                       tool_choice="forecast"))
    [got] = result.tool_calls
    assert got["function"]["name"] == "forecast" and json.loads(got["function"]["arguments"]) == args


def test_a_value_that_does_not_close_is_cut_at_the_answer_budget(tmp_path, dream_chat):
    llm = scripted_llm(tmp_path, dream_chat, "dream", {"text": LONG * 4})
    params = SamplingParams(sampler="llada", max_tokens=96, block_length=8, cache="none")
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"text": {"type": "string"}}}}}
    result = complete(llm, ChatRequest([{"role": "user", "content": "x"}], params, response_format=fmt))
    assert result.finish_reason == "length" and (LONG * 4).startswith(result.parsed["text"])
    assert 0 < len(llm.tokenizer.encode(result.content)) <= 96


def test_a_forced_call_cut_at_the_budget_is_sent_closed_with_finish_reason_length(tmp_path, dream_chat):
    """As OpenAI flags a call the budget truncated; its stream's chunks join to the same arguments."""
    call = '<tool_call>\n{"name": "note", "arguments": ' + json.dumps({"text": LONG * 4}) + "}\n</tool_call>"
    llm = LLM(str(write_scripted_checkpoint(tmp_path / "dream", dream_chat, call, MARKERS["dream"])))
    tool = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    request = ChatRequest([{"role": "user", "content": "x"}],
                          SamplingParams(sampler="llada", max_tokens=96, block_length=8, cache="none"),
                          tools=[tool], tool_choice="note")
    result = complete(llm, request)
    [call] = result.tool_calls
    assert result.finish_reason == "length"
    assert (LONG * 4).startswith(json.loads(call["function"]["arguments"])["text"])
    deltas = list(stream(llm, request))
    streamed = "".join(d.tool_call["function"]["arguments"] for d in deltas if d.tool_call)
    assert streamed == call["function"]["arguments"] and deltas[-1].result.finish_reason == "length"


def test_an_answer_with_no_room_for_its_values_still_parses_and_bills_nothing_twice(tmp_path, dream_chat):
    llm = scripted_llm(tmp_path, dream_chat, "dream", {"text": "hello"})
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 3}}}}}
    tight = len(llm.tokenizer.encode('{"text": 0}'))             # the least max_tokens the keys allow
    result = complete(llm, ChatRequest([{"role": "user", "content": "x"}],
                                       SamplingParams(sampler="llada", max_tokens=tight, cache="none"),
                                       response_format=fmt))
    assert result.finish_reason == "length" and json.loads(result.content) == {"text": ""}
    # one attempt: the answer took the budget, so none is left for another; it is billed once, within it
    assert result.parsed is None and result.earlier == [] and result.usage["completion_tokens"] <= tight


def test_an_answer_that_misses_is_sampled_again_while_max_tokens_holds_another(tmp_path, dream_chat):
    """The attempts of generate-and-validate share the request's max_tokens: each is billed its
    answer, and one runs only while what is left holds an answer as long as the one that missed."""
    llm = scripted_llm(tmp_path, dream_chat, "dream", {"text": "ab"})       # always misses minLength 3
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 3}}}}}
    answer = len(llm.tokenizer.encode('{"text": "ab"}'))
    for room, attempts in ((3 * answer + 1, 3), (2 * answer + 1, 2), (answer, 1)):
        result = complete(llm, ChatRequest([{"role": "user", "content": "x"}],
                                           SamplingParams(sampler="llada", max_tokens=room, cache="none"),
                                           response_format=fmt))
        assert result.parsed is None and json.loads(result.content) == {"text": "ab"}
        assert len(result.earlier) == attempts - 1 and result.usage["completion_tokens"] == attempts * answer


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_strings_of_1_to_65_tokens_and_numbers_of_1_to_12_digits(tmp_path, dream_chat, llada_chat, family):
    """Around every length a value's pass may end at: a token, the 32-token pass, two passes."""
    chat_folder = {"dream": dream_chat, "llada": llada_chat}[family]
    llm = scripted_llm(tmp_path / "probe", chat_folder, family, {})
    tok = llm.tokenizer
    words = "one two three four five six seven eight nine ten eleven twelve thirteen".split() * 10
    strings = {}
    for n in (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65):
        text = " ".join(words[:n])
        while len(tok.encode(text)) > n:                   # trim to exactly n tokens
            text = text[:-1]
        strings[f"s{n}"] = text
    numbers = {f"n{d}": int("9876543210987"[:d]) for d in range(1, 13)}
    answer = {**strings, **numbers}
    assert {len(tok.encode(v)) for v in strings.values()} >= {1, 32, 33, 64, 65}
    schema = {"type": "object", "properties": {**{k: {"type": "string"} for k in strings},
                                               **{k: {"type": "integer"} for k in numbers}}}
    llm = scripted_llm(tmp_path, chat_folder, family, answer)
    params = SamplingParams(sampler="threshold", max_tokens=1024, block_length=16, cache="none", threshold=0.9)
    result = complete(llm, ChatRequest([{"role": "user", "content": "x"}], params, response_format={
        "type": "json_schema", "json_schema": {"name": "lengths", "schema": schema}}))
    assert result.parsed == answer
