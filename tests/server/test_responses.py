"""OpenAI's Responses API (POST /v1/responses), driven by the official openai client (and LangChain's
ChatOpenAI where installed) over real HTTP on loopback, against the tiny chat checkpoint."""

import asyncio
import json
import time
import types

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from pydantic import TypeAdapter  # noqa: E402

from dlm_backend.server import create_app  # noqa: E402
from tests.helpers import serve_in_thread  # noqa: E402

ADD = [{"type": "function", "name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a", "b"]}}]
FORCED = {"type": "function", "name": "add"}
EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


@pytest.fixture(scope="module")
def app(dream_chat):
    return create_app(str(dream_chat), served_name="tiny")


@pytest.fixture(scope="module")
def server(app):
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused")


def raw(server, **body):
    """The route's JSON as sent (the client's own models are lenient: they construct without validating)."""
    import httpx
    r = httpx.post(server + "/v1/responses", json={"model": "tiny", **body}, timeout=120)
    return r.status_code, r.json()


def prompt_tokens(client, messages, **kwargs) -> int:
    """The prompt tokens of the same conversation sent to /v1/chat/completions: the Responses input
    must reach the model as the same prompt."""
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, **kwargs).usage.prompt_tokens


def test_text_with_instructions_and_a_list_of_messages(server, client):
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=16, extra_body={"block_length": 8})
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert r.output_text == message.content[0].text and message.content[0].type == "output_text"
    assert r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.max_output_tokens == 16 and r.tools == [] and r.tool_choice == "auto" and r.error is None
    told = client.responses.create(model="tiny", input="hi", instructions="Answer in French.", max_output_tokens=16)
    assert told.instructions == "Answer in French."
    assert told.usage.input_tokens == prompt_tokens(client, [{"role": "system", "content": "Answer in French."},
                                                             {"role": "user", "content": "hi"}])
    turns = client.responses.create(model="tiny", max_output_tokens=16, input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "and again"}])
    assert turns.output[0].type == "message"
    assert turns.usage.input_tokens == prompt_tokens(client, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "and again"}])
    again = client.responses.create(model="tiny", max_output_tokens=8, input=[     # an output item sent back
        {"role": "user", "content": "hi"}, message.model_dump(exclude_none=True), {"role": "user", "content": "more"}])
    assert again.usage.input_tokens == prompt_tokens(client, [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": message.content[0].text}, {"role": "user", "content": "more"}])
    status, body = raw(server, input="hi", max_output_tokens=8, metadata={"k": "v"}, store=True)
    assert status == 200 and openai.types.responses.Response.model_validate(body)
    assert body["store"] is False and body["metadata"] == {"k": "v"} and "output_text" not in body


def test_streamed_events_come_in_openais_order_and_add_up_to_the_answer(client):
    kwargs = dict(model="tiny", input="hi", max_output_tokens=16, extra_body={"block_length": 8})
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1 and kinds == (["response.created", "response.in_progress", "response.output_item.added",
                                      "response.content_part.added"] + ["response.output_text.delta"] * deltas
                                     + ["response.output_text.done", "response.content_part.done",
                                        "response.output_item.done", f"response.{whole.status}"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_a_forced_function_call_streamed_and_answered(server, client):
    r = client.responses.create(model="tiny", input="add 1 and 2", tools=ADD, tool_choice=FORCED, max_output_tokens=96)
    status, body = raw(server, input="add 1 and 2", tools=ADD, tool_choice=FORCED, max_output_tokens=96)
    assert status == 200 and openai.types.responses.Response.model_validate(body).output[0].type == "function_call"
    [call] = r.output
    assert call.type == "function_call" and call.name == "add" and call.id.startswith("fc_")
    assert call.call_id.startswith("call_") and set(json.loads(call.arguments)) == {"a", "b"}
    assert r.tools[0].name == "add" and r.tool_choice.name == "add"
    events = list(client.responses.create(stream=True, model="tiny", input="add 1 and 2", tools=ADD,
                                          tool_choice="required", max_output_tokens=96))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert kinds == (["response.created", "response.in_progress", "response.output_item.added"]
                     + ["response.function_call_arguments.delta"] * deltas
                     + ["response.function_call_arguments.done", "response.output_item.done",
                        f"response.{events[-1].response.status}"])
    assert events[2].item.type == "function_call" and events[2].item.arguments == ""
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert set(json.loads(done.arguments)) == {"a", "b"}
    with client.responses.stream(model="tiny", input="add 1 and 2", tools=ADD, tool_choice=FORCED,
                                 max_output_tokens=96) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output[0].type == "function_call" and set(json.loads(final.output[0].arguments)) == {"a", "b"}
    answer = client.responses.create(model="tiny", tools=ADD, max_output_tokens=16, input=[
        {"role": "user", "content": "add 1 and 2"}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "3"}])
    assert answer.output and answer.usage.input_tokens == prompt_tokens(client, [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "add", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "3"}],
        tools=[{"type": "function", "function": {k: v for k, v in ADD[0].items() if k != "type"}}])


def test_every_request_gives_its_slot_back_a_stream_closed_early_too(app, client):
    with client.responses.create(stream=True, model="tiny", input="hi", max_output_tokens=64,
                                 extra_body={"block_length": 8}) as events:
        next(iter(events))
    for _ in range(200):
        if app.state.served.held == 0:
            break
        time.sleep(0.05)
    assert app.state.served.held == 0


def test_json_schema_text_format(client):
    import jsonschema
    schema = {"type": "object", "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["age", "ok"], "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    r = client.responses.create(model="tiny", input="Bob is 3", max_output_tokens=64, text=fmt)
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    events = list(client.responses.create(model="tiny", input="Bob is 3", max_output_tokens=64, stream=True, text=fmt))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text

    import pydantic

    class Person(pydantic.BaseModel):
        age: int
        ok: bool

    parsed = client.responses.parse(model="tiny", input="Bob is 3", max_output_tokens=64, text_format=Person)
    assert isinstance(parsed.output_parsed, Person)


def test_a_small_budget_is_incomplete_with_the_reason(client):
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=4, extra_body={"block_length": 4})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 4


@pytest.mark.parametrize("body,param", [
    ({"blok_length": 4}, "blok_length"),
    ({"max_tokens": 4}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": ADD, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "3"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": "x " * 600}, "input"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
])
def test_what_is_not_served_is_a_400_naming_the_field(client, body, param):
    body = dict(body)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input=body.pop("input", "hi"), extra_body=body)
    assert caught.value.body["param"] == param, caught.value.body


def test_an_unknown_model_is_openais_404(client):
    with pytest.raises(openai.NotFoundError, match="not served") as caught:
        client.responses.create(model="gpt-nope", input="hi")
    assert caught.value.code == "model_not_found"


HEAD = {"id": "resp_1", "object": "response", "created_at": 0, "status": "in_progress", "model": "tiny",
        "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def streamed(monkeypatch, deltas) -> tuple[list[str], list]:
    """The SSE lines of a streamed response whose chat layer yields ``deltas``, and their events as
    the openai package's ResponseStreamEvent types validate them (strictly: required fields present)."""
    from dlm_backend.server import responses_stream

    async def astream(llm, request, plan):
        for delta in deltas:
            if isinstance(delta, Exception):
                raise delta
            yield types.SimpleNamespace(**{"result": None, "tool_call": None, "content": "", "index": 0, **delta})

    monkeypatch.setattr(responses_stream, "chat", types.SimpleNamespace(astream=astream))

    async def collect():
        return [e async for e in responses_stream.response_events(None, types.SimpleNamespace(request=None), HEAD)]

    lines = asyncio.run(collect())
    return lines, [EVENT.validate_python(json.loads(line.split("data: ", 1)[1])) for line in lines]


def test_streamed_calls_become_function_call_items_and_a_newline_before_them_no_message(monkeypatch):
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    result = types.SimpleNamespace(finish_reason="tool_calls", usage=usage, num_forward_passes=3)
    _, events = streamed(monkeypatch, [
        {"content": "\n"},
        {"tool_call": {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1'}}},
        {"tool_call": {"function": {"arguments": ', "b": true}'}}},
        {"tool_call": {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{}"}}, "index": 1},
        {"result": result}])
    call = ["response.output_item.added", "response.function_call_arguments.delta"]
    done = ["response.function_call_arguments.done", "response.output_item.done"]
    assert [e.type for e in events] == (["response.created", "response.in_progress"] + call
                                        + ["response.function_call_arguments.delta"] + done + call + done
                                        + ["response.completed"])
    final = openai.types.responses.Response.model_validate(events[-1].response.model_dump())
    assert [(o.call_id, o.arguments, o.status) for o in final.output] == [
        ("call_1", '{"a": 1, "b": true}', "completed"), ("call_2", "{}", "completed")]
    assert final.usage.input_tokens == 5 and final.usage.output_tokens == 7 and final.status == "completed"
    assert [e.output_index for e in events[2:-1]] == [0] * 5 + [1] * 4


def test_a_failure_after_the_200_is_one_error_event_and_nothing_after(monkeypatch):
    from dlm_backend.errors import EngineError

    lines, events = streamed(monkeypatch, [{"content": "Hel"}, EngineError("The engine failed.")])
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                        "response.content_part.added", "response.output_text.delta", "error"]
    assert events[-1].code == "server_error" and "engine failed" in events[-1].message
    assert all(line.startswith(f"event: {e.type}\n") for line, e in zip(lines, events))


def test_langchain_chat_openai_on_the_responses_api(server):
    lc = pytest.importorskip("langchain_openai")
    model = lc.ChatOpenAI(base_url=server + "/v1", api_key="unused", model="tiny", use_responses_api=True,
                          max_tokens=96)
    reply = model.invoke("hi")
    assert reply.text and reply.usage_metadata["output_tokens"] > 0
    assert "".join(chunk.text for chunk in model.stream("hi")) == reply.text

    def add(a: int, b: bool) -> int:
        """Add two numbers."""
        return a

    called = model.bind_tools([add], tool_choice="add").invoke("add 1 and 2")
    [call] = called.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}
    from langchain_core.messages import HumanMessage, ToolMessage
    # the call and its result go back as function_call and function_call_output items
    turns = [HumanMessage("add 1 and 2"), called, ToolMessage("3", tool_call_id=call["id"])]
    after = model.bind_tools([add]).invoke(turns)
    assert after.usage_metadata["input_tokens"] > called.usage_metadata["input_tokens"]
