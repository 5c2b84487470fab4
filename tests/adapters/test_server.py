"""The OpenAI-compatible server, driven by the official openai client over real HTTP on loopback."""

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from dlm_backend.server import create_app  # noqa: E402
from helpers import serve_in_thread  # noqa: E402


@pytest.fixture(scope="module")
def server(dream_chat):
    with serve_in_thread(create_app(str(dream_chat), served_name="tiny")) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused")


def test_models_and_health(server, client):
    import httpx
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_plain_streaming_and_extra_knobs(client):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                  extra_body={"block_length": 8, "sampler": "llada", "steps": 16})
    r = client.chat.completions.create(**kwargs)
    text = r.choices[0].message.content
    assert r.usage.completion_tokens > 0 and r.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_json_schema_response_format(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Bob is 3"}], max_tokens=64,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "p", "schema": schema}})
    import json
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


def test_completions_endpoint(client):
    r = client.completions.create(model="tiny", prompt="The quick", max_tokens=8, extra_body={"block_length": 8})
    assert isinstance(r.choices[0].text, str)
    streamed = list(client.completions.create(model="tiny", prompt="The quick", max_tokens=8, stream=True,
                                              extra_body={"block_length": 8}))
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


def test_bad_requests_are_400_with_a_message(client):
    with pytest.raises(openai.BadRequestError, match="cache must be one of"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"cache": "bogus"})
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x " * 600}])
    with pytest.raises(openai.BadRequestError, match="tool_calls needs"):        # no name: was a KeyError, a 500
        client.chat.completions.create(model="tiny", messages=[
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}])
    with pytest.raises(openai.BadRequestError, match="threshold must be a number"):   # was a TypeError, a 500
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"threshold": "0.9"})


@pytest.mark.parametrize("extra,match", [({"sampler": "nope"}, "nope"), ({}, "context")])
def test_a_bad_streamed_request_is_a_400_before_any_event(client, extra, match):
    """OpenAI refuses a bad streamed request with a 400; the engine's own checks used to run after
    the 200 and arrive as an error event."""
    long = "x " * (600 if not extra else 1)
    with pytest.raises(openai.BadRequestError, match=match):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}],
                                       stream=True, extra_body=extra)
    with pytest.raises(openai.BadRequestError, match=match):
        client.completions.create(model="tiny", prompt=long, stream=True, extra_body=extra)


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tool_calls_over_sse_and_tool_choice_none(client):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "weather in Oslo?"}], tools=WEATHER,
                  max_tokens=96, extra_body={"block_length": 16})
    chunks = list(client.chat.completions.create(
        stream=True, tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kwargs))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    import json
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    r = client.chat.completions.create(tool_choice="none", **kwargs)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
