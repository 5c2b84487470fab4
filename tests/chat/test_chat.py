"""Tool-call parsing for the Hermes / Qwen2.5 format."""

from dlm_backend.chat.tool_calls import parse_tool_calls


def test_single_call():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
    assert parse_tool_calls(text) == ("", [{"name": "get_weather", "arguments": {"city": "Lisbon"}}], [])


def test_content_and_several_calls_and_string_arguments():
    text = ('Let me check.\n<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    content, calls, bad = parse_tool_calls(text)
    assert content == "Let me check." and bad == []
    assert calls == [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]


def test_malformed_calls_are_reported_not_raised():
    content, calls, bad = parse_tool_calls('<tool_call>{"name": "a", "arguments": {</tool_call>')
    assert calls == [] and len(bad) == 1
    _, calls, bad = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert calls == [] and len(bad) == 1


def test_stray_closers_after_a_complete_call_are_repaired_unless_scoring():
    """Two parallel passes both wrote the closing braces (dlm-tiny, entropy_bounded, Lisbon)."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}"}}\n</tool_call>'
    assert parse_tool_calls(text) == ("", [{"name": "get_weather", "arguments": {"city": "Lisbon"}}], [])
    content, calls, bad = parse_tool_calls(text, repair=False)
    assert calls == [] and bad[0]["name"] == "get_weather" and content == text


def test_words_after_a_call_are_not_repaired_away():
    text = '<tool_call>{"name": "a", "arguments": {}} and also b</tool_call>'
    content, calls, bad = parse_tool_calls(text)
    assert calls == [] and bad[0]["arguments"] == '{"name": "a", "arguments": {}} and also b'


def test_a_malformed_call_stays_in_the_content_and_is_reported():
    text = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    content, calls, bad = parse_tool_calls(text)
    assert content == text and calls == []
    assert bad == [{"name": "get_weather", "arguments": '{"name": "get_weather", "arguments": {"city":',
                    "error": bad[0]["error"], "text": text[len("Checking. "):]}]
    assert bad[0]["error"].startswith("malformed tool call")


def test_unterminated_call_still_parses():
    _, calls, _ = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"q": "z"}}')
    assert calls == [{"name": "a", "arguments": {"q": "z"}}]


def test_plain_text_has_no_calls():
    assert parse_tool_calls("Paris.") == ("Paris.", [], [])


# -- the shared request path ----------------------------------------------------------------------

import json  # noqa: E402

import pytest  # noqa: E402

from dlm_backend import LLM, DLMError, SamplingParams  # noqa: E402
from dlm_backend.chat import ChatRequest, Plan, complete, normalize_messages, stream  # noqa: E402
from dlm_backend.chat.plan import Call, Free  # noqa: E402
from dlm_backend.chat.run import _Splitter  # noqa: E402
from dlm_backend.chat.tool_calls import normalize_tools, tool_choice_name  # noqa: E402
from dlm_backend.chat.structured import plan_json, templatable  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "score": {"type": "number"}, "member": {"type": "boolean"},
                                           "tier": {"enum": ["gold", "silver"]}}, "required": ["name"]}
PERSON_TOOL = {"type": "function", "function": {"name": "set_person", "parameters": PERSON}}


def test_normalize_messages_handles_framework_shapes():
    msgs = normalize_messages([
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert msgs[3]["tool_call_id"] == "c1" and msgs[1]["name"] == "bob"


@pytest.mark.parametrize("bad,match", [
    ([], "empty"),
    ([{"role": "wizard", "content": "x"}], "Unknown message role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "text only"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}], "not valid JSON"),
])
def test_bad_messages_are_clear_errors(bad, match):
    with pytest.raises(DLMError, match=match):
        normalize_messages(bad)


def test_tools_and_tool_choice():
    assert normalize_tools([WEATHER])[0]["function"]["name"] == "get_weather"
    with pytest.raises(DLMError, match="Malformed tool"):
        normalize_tools([{"type": "function", "function": {"description": "no name"}}])
    with pytest.raises(DLMError, match="type object"):
        normalize_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])
    tools = normalize_tools([WEATHER, TIME])
    assert tool_choice_name("auto", tools) is None and tool_choice_name("none", tools) == "none"
    assert tool_choice_name("any", tools) is True and tool_choice_name("any", tools[:1]) == "get_weather"
    assert tool_choice_name({"type": "function", "function": {"name": "get_time"}}, tools) == "get_time"
    with pytest.raises(DLMError, match="not among the tools"):
        tool_choice_name("nope", tools)


def test_template_without_tools_gets_a_tool_prompt(llada_chat):
    llm = LLM(str(llada_chat))
    plan = Plan(llm, ChatRequest([{"role": "user", "content": "weather?"}], tools=[WEATHER]))
    text = llm.tokenizer.decode(plan.prompt_ids, skip_special_tokens=False)
    assert "get_weather" in text and "<tool_call>" in text


def test_template_without_tools_keeps_the_tool_turns(llada_chat):
    """An agent's second turn on LLaDA: its own call and the result must reach the prompt as text."""
    llm = LLM(str(llada_chat))
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]
    for tools in ([WEATHER], None):         # frameworks may drop the tools on the turn after the result
        text = llm.tokenizer.decode(Plan(llm, ChatRequest(messages, tools=tools)).prompt_ids,
                                    skip_special_tokens=False)
        assert text.count("system<|end_header_id|>") == 1 and "Be brief." in text
        assert ("You can call these tools" in text) == bool(tools)
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
        assert "user<|end_header_id|>\n\n<tool_response>\nsunny, 21 C\n</tool_response>" in text
        assert "tool<|end_header_id|>" not in text


def test_forced_tool_choice_writes_the_whole_call(dream_chat):
    """A forced tool with templatable parameters is a skeleton: an untrained model's call parses."""
    llm = LLM(str(dream_chat))
    nested = {"type": "function", "function": {"name": "plan", "parameters": {
        "type": "object", "properties": {"stops": {"type": "array", "items": {"type": "string"}}}}}}
    cases = (("get_time", [WEATHER, TIME], "llada"), ("get_weather", [WEATHER, TIME], "threshold"),
             ("any", [PERSON_TOOL], "llada"), ("any", [WEATHER, TIME], "threshold"))
    for choice, tools, sampler in cases:
        req = ChatRequest([{"role": "user", "content": "weather?"}],
                          SamplingParams(sampler=sampler, max_tokens=160, block_length=32, cache="dual"),
                          tools=tools, tool_choice=choice)
        result = complete(llm, req)
        name = choice if choice != "any" else ("set_person" if len(tools) == 1 else result.tool_calls[0]["function"]["name"])
        assert name in [t["function"]["name"] for t in tools]
        assert result.output.text.startswith(f'<tool_call>\n{{"name": "{name}", "arguments": {{')
        assert result.finish_reason == "tool_calls" and result.content == ""
        [call] = result.tool_calls
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == name
        expected = {"get_time": set(), "get_weather": {"city"}, "set_person": set(PERSON["properties"])}[name]
        assert set(args) == expected and all(isinstance(v, str) for k, v in args.items() if k in ("city", "name"))
    # parameters that cannot be templated: the call head is written and the model finishes it
    plan = Plan(llm, ChatRequest([{"role": "user", "content": "x"}], SamplingParams(max_tokens=64),
                                 tools=[nested], tool_choice="plan"))
    assert isinstance(plan.shape, Call) and plan.shape.plan is None
    assert llm.tokenizer.decode(plan.template) == '<tool_call>\n{"name": "plan", "arguments":'


def test_forced_tool_call_that_cannot_fit_says_so(dream_chat):
    llm = LLM(str(dream_chat))
    req = ChatRequest([{"role": "user", "content": "x"}], SamplingParams(max_tokens=16, block_length=8),
                      tools=[PERSON_TOOL], tool_choice="set_person")
    with pytest.raises(DLMError, match="forced tool call needs .* raise max_tokens"):
        complete(llm, req)


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


def test_json_skeleton_fixes_keys_in_the_canvas(dream_chat):
    tok = LLM(str(dream_chat)).tokenizer
    plan = plan_json(tok, {"type": "json_schema", "json_schema": {"schema": PERSON}}, 128)
    fixed = tok.decode([t for t in plan.template if t is not None])
    assert fixed.startswith('{"name": "') and '", "age":' in fixed and fixed.endswith('"}')
    with pytest.raises(DLMError, match="raise max_tokens"):
        plan_json(tok, {"type": "json_schema", "json_schema": {"schema": PERSON}}, 10)
    nested = {"type": "object", "properties": {"a": {"type": "array"}}}
    assert plan_json(tok, {"type": "json_schema", "json_schema": {"schema": nested}}, 64).slots == []


def test_stream_splits_content_and_tool_calls(dream_chat):
    class FakePlan:
        tools, shape = [WEATHER], Free()

    s = _Splitter(FakePlan())
    events = []
    for piece in ["Sure. <tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {}}\n</tool_call>", " done"]:
        events += s.feed(piece)
    assert "".join(e.content for e in events) == "Sure.  done"
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, ignore_eos=True)
    deltas = list(stream(llm, ChatRequest([{"role": "user", "content": "hi"}], params)))
    assert deltas[-1].result is not None
    assert "".join(d.content for d in deltas) == deltas[-1].result.content


def test_a_malformed_call_reaches_the_result_and_the_stream_as_content(dream_chat):
    from dlm_backend.engine.outputs import GenerationOutput

    llm = LLM(str(dream_chat))
    plan = Plan(llm, ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=16), tools=[WEATHER]))
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {oops}</tool_call>'
    result = plan.finish(GenerationOutput("r", [1], [2, 3], text, "stop", 2), plan.shape, [])
    assert result.content == text and result.tool_calls == [] and result.finish_reason == "stop"
    assert result.invalid_tool_calls[0]["name"] == "get_weather"
    splitter = _Splitter(plan)
    events = splitter.feed(text) + splitter.close(result)
    assert "".join(e.content for e in events) == text
    assert not any(e.tool_call for e in events)


def test_a_stream_ending_in_what_might_have_begun_a_call_sends_it_as_content(dream_chat):
    from dlm_backend.engine.outputs import GenerationOutput

    llm = LLM(str(dream_chat))
    plan = Plan(llm, ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=16), tools=[WEATHER]))
    for text in ["3 < 4 <", "cut off at <tool_"]:
        splitter = _Splitter(plan)
        result = plan.finish(GenerationOutput("r", [1], [2, 3], text, "length", 2), plan.shape, [])
        events = splitter.feed(text[:4]) + splitter.feed(text[4:]) + splitter.close(result)
        assert "".join(e.content for e in events) == result.content == text


def test_a_forced_call_streams_no_content_as_complete_gives_none(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=96, block_length=16, ignore_eos=True)
    request = ChatRequest([{"role": "user", "content": "weather in Oslo?"}], params, tools=[WEATHER],
                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    deltas = list(stream(llm, request))
    assert "".join(d.content for d in deltas) == "" == deltas[-1].result.content
    assert [d.tool_call["function"]["name"] for d in deltas if d.tool_call] == ["get_weather"]


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


LIST_SCHEMA = {"type": "object", "properties": {"cities": {"type": "array", "items": {"type": "string"}}},
               "required": ["cities"]}


def test_json_without_skeleton_is_validated_against_the_schema(dream_chat):
    llm = LLM(str(dream_chat))
    plan = plan_json(llm.tokenizer, {"type": "json_schema", "json_schema": {"name": "l", "schema": LIST_SCHEMA}}, 32)
    assert not plan.slots
    assert plan.parse(llm.tokenizer, [], 'Sure: {"cities": ["Oslo", "Kyoto"]}') == (
        {"cities": ["Oslo", "Kyoto"]}, 'Sure: {"cities": ["Oslo", "Kyoto"]}')
    assert plan.parse(llm.tokenizer, [], '{"cities": "Oslo"}')[0] is None          # parses, misses the schema
    assert plan.parse(llm.tokenizer, [], '{"cities": [')[0] is None
    loose = plan_json(llm.tokenizer, {"type": "json_object"}, 32)
    assert loose.parse(llm.tokenizer, [], '{"any": 1}')[0] == {"any": 1}
    with pytest.raises(DLMError, match="not a valid JSON schema: 'two' is not of type 'integer'"):
        plan_json(llm.tokenizer, {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "array", "minItems": "two"}}}}}, 32)


def test_json_that_misses_its_schema_is_sampled_again(dream_chat, monkeypatch):
    """Generate-and-validate: the untrained model never writes a valid answer, so every attempt runs."""
    llm = LLM(str(dream_chat))
    seen = []
    generate = llm.generate
    monkeypatch.setattr(llm, "generate", lambda *a, **k: (seen.append(k["sampling_params"]), generate(*a, **k))[1])
    fmt = {"type": "json_schema", "json_schema": {"name": "l", "schema": LIST_SCHEMA}}
    result = complete(llm, ChatRequest([{"role": "user", "content": "cities"}], SamplingParams(max_tokens=24),
                                       response_format=fmt))
    assert result.parsed is None and result.content
    assert [(p.temperature, p.seed) for p in seen] == [(0.0, None), (0.7, 1), (0.7, 2)]
    outs = [result.output, *result.earlier]                  # usage and passes count every attempt
    assert len(outs) == 3 and result.num_forward_passes == sum(o.num_forward_passes for o in outs)
    assert result.usage["completion_tokens"] == sum(len(o.token_ids) for o in outs)
    assert result.usage["prompt_tokens"] == 3 * len(result.output.prompt_token_ids)
    seen.clear()
    templated = {"type": "json_schema", "json_schema": {"name": "c", "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    assert complete(llm, ChatRequest([{"role": "user", "content": "city"}], SamplingParams(max_tokens=24),
                                     response_format=templated)).parsed is not None
    assert len(seen) == 1                                    # a skeleton always parses: one pass of the canvas


def test_any_of_several_tools_async_and_streamed(dream_chat):
    """The name pass runs on every path: acomplete, stream and astream each end in one parsed call."""
    import asyncio

    from dlm_backend.chat import acomplete, astream

    llm = LLM(str(dream_chat))
    req = ChatRequest([{"role": "user", "content": "weather?"}],
                      SamplingParams(max_tokens=96, block_length=32, cache="dual", sampler="threshold"),
                      tools=[WEATHER, TIME], tool_choice="required")

    async def streamed():
        return [d async for d in astream(llm, req)]

    results = [asyncio.run(acomplete(llm, req)), list(stream(llm, req))[-1].result, asyncio.run(streamed())[-1].result]
    for result in results:
        [call] = result.tool_calls
        assert call["function"]["name"] in ("get_weather", "get_time") and result.finish_reason == "tool_calls"
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


WEATHER_SCHEMA = {"type": "json_schema", "json_schema": {"name": "report", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "summary": {"type": "string"}}}}}
KYOTO = [{"role": "user", "content": "What's the weather in Kyoto?"}]
GREEDY = SamplingParams(sampler="llada", max_tokens=64, block_length=32, steps=64)


def test_tools_with_a_schema_may_call_a_tool_first():
    """OpenAI's rule for tools plus response_format (LangChain's create_agent with a response_format
    sends both): the model may call a tool; the schema shapes the reply that calls none. The schema's
    skeleton used to be laid over every reply, so no call could ever be written."""
    llm = LLM()                      # dlm-tiny: calls get_weather for this prompt
    for run in (complete, lambda llm, req: [d.result for d in stream(llm, req) if d.result][0]):
        result = run(llm, ChatRequest(KYOTO, GREEDY, tools=[WEATHER], response_format=WEATHER_SCHEMA))
        assert [c["function"]["name"] for c in result.tool_calls] == ["get_weather"], result.output.text
        assert result.parsed is None and result.earlier == []


def test_tools_with_a_schema_answer_in_the_schema_when_no_tool_is_called(dream_chat):
    llm = LLM(str(dream_chat))       # random weights: it writes no well-formed call
    request = ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=48, block_length=16),
                          tools=[WEATHER], response_format=WEATHER_SCHEMA)
    for result in (complete(llm, request), [d.result for d in stream(llm, request) if d.result][0]):
        assert result.tool_calls == [] and list(result.parsed) == ["city", "summary"]
        assert json.loads(result.content) == result.parsed
        assert len(result.earlier) == 1            # the free pass that called nothing is billed too


def test_a_skeleton_answer_that_breaks_the_schema_is_not_returned_as_parsed(dream_chat):
    """Bounds and patterns are not in the skeleton: a slot left at 0 against minimum 18 was returned
    as parsed. Now it is checked, sampled again like generated JSON, and reported as None."""
    from dlm_backend.chat.structured import validates
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 30},
                                               "code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    result = complete(LLM(str(dream_chat)), ChatRequest([{"role": "user", "content": "A person."}],
                                                        SamplingParams(max_tokens=48), response_format=fmt))
    assert result.parsed is None and len(result.earlier) == 2       # random weights cannot meet it
    assert not validates(schema, json.loads(result.content))       # and the content says why


def test_a_literal_is_written_by_the_skeleton(dream_chat):
    """pydantic writes Literal["person"] as const: it was a free string slot, so it never matched."""
    schema = {"type": "object", "properties": {"kind": {"const": "person", "type": "string"},
                                               "name": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    result = complete(LLM(str(dream_chat)), ChatRequest([{"role": "user", "content": "A person."}],
                                                        SamplingParams(max_tokens=48), response_format=fmt))
    assert result.parsed["kind"] == "person" and set(result.parsed) == {"kind", "name"}


def test_a_forced_call_without_a_skeleton_is_sampled_again_when_it_misses(dream_chat):
    """Array parameters have no skeleton: a call with argument names the tool does not have (or no
    call) came back as the answer to a forced tool_choice. It is now checked and sampled again."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"cities": {"type": "array", "items": {"type": "string"}}},
        "required": ["cities"], "additionalProperties": False}}}
    result = complete(LLM(str(dream_chat)), ChatRequest([{"role": "user", "content": "Paris?"}],
                                                        SamplingParams(max_tokens=48), tools=[tool],
                                                        tool_choice="required"))
    assert len(result.earlier) == 2 and result.tool_calls == []   # random weights: three misses, none passed off


def test_a_call_missing_its_closing_tag_does_not_swallow_the_next():
    text = ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n'
            '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    content, calls, bad = parse_tool_calls(text)
    assert calls == [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}] and not bad
