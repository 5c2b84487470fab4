"""Running a chat request (chat/run.py): complete and stream, sync and async, and the stream's split
into content and tool calls."""

import json

from tests.chat.chat_cases import TIME, WEATHER

from dlm_backend import LLM, SamplingParams
from dlm_backend.chat import ChatRequest, Plan, stream
from dlm_backend.chat.plan import Free
from dlm_backend.chat.run import Splitter


def test_stream_splits_content_and_tool_calls(dream_chat):
    s = Splitter(Free(), [WEATHER])
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
    splitter = Splitter(plan.shape, plan.tools)
    events = splitter.feed(text) + splitter.close(result)
    assert "".join(e.content for e in events) == text
    assert not any(e.tool_call for e in events)


def test_a_stream_ending_in_what_might_have_begun_a_call_sends_it_as_content(dream_chat):
    from dlm_backend.engine.outputs import GenerationOutput

    llm = LLM(str(dream_chat))
    plan = Plan(llm, ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=16), tools=[WEATHER]))
    for text in ["3 < 4 <", "cut off at <tool_"]:
        splitter = Splitter(plan.shape, plan.tools)
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
    chunks = [d.tool_call for d in deltas if d.tool_call]
    assert chunks[0]["function"]["name"] == "get_weather" and chunks[0]["id"]
    assert all(set(c) == {"function"} and set(c["function"]) == {"arguments"} for c in chunks[1:])
    arguments = "".join(c["function"]["arguments"] for c in chunks)
    assert arguments == deltas[-1].result.tool_calls[0]["function"]["arguments"]


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
        # random weights may run a string to the budget: the call still comes, flagged "length"
        assert call["function"]["name"] in ("get_weather", "get_time")
        assert result.finish_reason in ("tool_calls", "length")
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
