"""The OpenAI-compatible server, driven by the official openai client over real HTTP on loopback."""

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from dlm_backend.server import create_app  # noqa: E402
from tests.helpers import serve_in_thread  # noqa: E402


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
    assert calls[0].function.name == "get_weather" and all(not tc.function.name for tc in calls[1:])
    import json
    assert set(json.loads("".join(tc.function.arguments for tc in calls))) == {"city"}
    # random weights may run a string to the budget: the call still comes, flagged "length"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons in (["tool_calls"], ["length"])
    r = client.chat.completions.create(tool_choice="none", **kwargs)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_requests_that_were_500s_are_400s_naming_the_field(client):
    """Each of these was an internal error (a traceback turned 500) before it was checked."""
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="'text' must be a string"):          # TypeError in join
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}])
    with pytest.raises(openai.BadRequestError, match="names no tool"):                   # AttributeError
        client.chat.completions.create(model="tiny", messages=hi, tools=WEATHER,
                                       tool_choice={"type": "function", "function": None})
    r = client.chat.completions.create(model="tiny", messages=hi, tools=WEATHER, max_tokens=96,   # a bare name
                                       tool_choice={"type": "function", "function": "get_weather"})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    for seed in (2**64, -2**63 - 1):                                                     # overflow in manual_seed
        with pytest.raises(openai.BadRequestError, match="seed must be in"):
            client.chat.completions.create(model="tiny", messages=hi, max_tokens=8, seed=seed)
        with pytest.raises(openai.BadRequestError, match="seed must be in"):
            client.completions.create(model="tiny", prompt="hi", max_tokens=8, seed=seed, stream=True)


def test_null_n_and_stream_are_defaults_and_logprobs_come_as_openai_shapes_them(client):
    hi = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=hi, max_tokens=8, extra_body={"n": None, "stream": None})
    assert r.object == "chat.completion"
    r = client.chat.completions.create(model="tiny", messages=hi, max_tokens=8, logprobs=False)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model="tiny", messages=hi, max_tokens=8, logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8 and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content.strip()[:1])
    assert all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs=true"):
        client.chat.completions.create(model="tiny", messages=hi, max_tokens=8, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="from 0 to 20"):
        client.chat.completions.create(model="tiny", messages=hi, max_tokens=8, logprobs=True, top_logprobs=21)
    t = client.completions.create(model="tiny", prompt="hi", max_tokens=6, logprobs=3, extra_body={"ignore_eos": True})
    lp = t.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 6 and all(len(d) <= 3 for d in lp.top_logprobs)
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(6)]
    with pytest.raises(openai.BadRequestError, match="echo=True is not supported"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=8, echo=True)


def test_streamed_logprobs_and_canvas_frames_only_when_asked(client):
    hi = [{"role": "user", "content": "hi"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=hi, max_tokens=12, stream=True,
                                                 logprobs=True, extra_body={"ignore_eos": True},
                                                 stream_options={"include_usage": True, "include_canvas": True}))
    frames = [c.model_extra["dlm_canvas"] for c in chunks if (c.model_extra or {}).get("dlm_canvas")]
    assert frames and [f["pass"] for f in frames] == list(range(1, len(frames) + 1))
    assert all(not c.choices for c in chunks if (c.model_extra or {}).get("dlm_canvas"))   # a choice-less chunk
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert len(tokens) == chunks[-1].usage.completion_tokens == 12
    plain = list(client.chat.completions.create(model="tiny", messages=hi, max_tokens=12, stream=True))
    assert not any((c.model_extra or {}).get("dlm_canvas") or (c.choices and c.choices[0].logprobs) for c in plain)


def test_model_retrieve_token_id_prompts_and_completion_usage_chunk(client, dream_chat):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4o")
    from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
    ids = Tokenizer(dream_chat).encode("The quick")
    kwargs = dict(model="tiny", max_tokens=8, extra_body={"block_length": 8})
    r = client.completions.create(prompt="The quick", **kwargs)
    for prompt in (ids, [ids]):          # token ids, as OpenAI's completions API takes them
        by_ids = client.completions.create(prompt=prompt, **kwargs)
        assert by_ids.choices[0].text == r.choices[0].text and by_ids.usage == r.usage
    chunks = list(client.completions.create(prompt="The quick", stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    assert chunks[-1].choices == [] and chunks[-1].usage == r.usage
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_stop_strings_do_not_cut_the_fixed_text_of_a_forced_call_or_a_json_skeleton(client):
    """A stop of "\\n" matched the '<tool_call>\\n' the server itself writes and emptied the arguments;
    stop strings count only in what the model generates past the template."""
    hi = [{"role": "user", "content": "weather in Oslo?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    calls = [client.chat.completions.create(model="tiny", messages=hi, tools=WEATHER, tool_choice=named, max_tokens=96,
                                            **stop).choices[0].message.tool_calls[0].function.arguments
             for stop in ({}, {"stop": ["\n"]})]
    assert calls[1] == calls[0]
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}}}}
    contents = [client.chat.completions.create(model="tiny", messages=hi, response_format=fmt, max_tokens=64,
                                               **stop).choices[0].message.content for stop in ({}, {"stop": ['"']})]
    assert contents[1] == contents[0]


def test_required_call_over_several_tools_that_cannot_fit_is_a_400_before_the_stream(client):
    """The name pass fit, each tool's skeleton did not: the error used to come as an event after a 200."""
    tools = WEATHER + [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}]
    with pytest.raises(openai.BadRequestError, match="forced tool call needs"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=tools,
                                       tool_choice="required", max_tokens=20, stream=True)


@pytest.mark.parametrize("extra,status,param,match", [
    ({"thresold": 0.5}, 400, "thresold", "Did you mean 'threshold'"),          # a typo was silently ignored
    ({"eps": 5.0}, 400, "eps", r"eps must be in \(0, 1\)"),                    # out of range was ignored
    ({"temperature": 5}, 400, "temperature", r"temperature must be in \[0, 2\]"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty", "presence_penalty=0.5 is not supported"),
    ({"frequency_penalty": 1}, 400, "frequency_penalty", "not supported"),
    ({"logit_bias": {"5": 10}}, 400, "logit_bias", "not supported"),
    ({"max_tokens": 0}, 400, "max_tokens", "max_tokens"),
])
def test_unknown_misspelled_and_unserved_fields_are_400s_naming_the_field(client, extra, status, param, match):
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match=match) as err:
        client.chat.completions.create(model="tiny", messages=hi, max_tokens=extra.pop("max_tokens", 8),
                                       extra_body=extra)
    assert err.value.status_code == status and err.value.param == param
    assert set(err.value.body) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("kwargs,param", [
    ({"max_tokens": 0}, "max_tokens"), ({"n": 2}, "n"), ({"top_logprobs": 3}, "top_logprobs"), ({"top_p": 2}, "top_p"),
    ({"messages": []}, "messages"), ({"max_tokens": 10**6}, "max_tokens"), ({"temperature": 5}, "temperature"),
])
def test_refusals_are_openais_error_shape(client, kwargs, param):
    """The cases the issue listed, as the openai client reads them: its BadRequestError, with the
    four keys OpenAI's body has and ``param`` naming the field (the body had two keys before)."""
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**request)
    assert err.value.status_code == 400 and err.value.param == param and err.value.type == "invalid_request_error"
    assert set(err.value.body) == {"message", "type", "param", "code"}


def test_neutral_openai_fields_pass_and_an_unknown_model_is_a_404(client):
    hi = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=hi, max_tokens=4, presence_penalty=0,
                                       frequency_penalty=0.0, n=1, user="u1", metadata={"a": "b"})
    assert r.choices[0].message.role == "assistant"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=hi, max_tokens=4)
    assert err.value.code == "model_not_found" and err.value.param == "model"


def test_served_model_names_are_aliases(dream_chat):
    from dlm_backend.server.settings import ServerConfig

    app = create_app(config=ServerConfig(model=str(dream_chat), served_name=["tiny", "tiny-latest"]))
    with serve_in_thread(app) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        assert [m.id for m in c.models.list().data] == ["tiny", "tiny-latest"]
        r = c.chat.completions.create(model="tiny-latest", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.model == "tiny-latest"


def test_a_request_checks_and_layers_its_knobs_once(server, monkeypatch):
    """The body's knobs were resolved and checked twice a request (the body, then the front doors'
    layering again) and the checkpoint's defaults layered twice (once only to read the default canvas)."""
    import sys

    import httpx

    from dlm_backend.engine import params, sampling_defaults

    hi = {"model": "tiny", "block_length": 4, "seed": 1}
    bodies = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),    # the default canvas
              ("/v1/completions", {"prompt": "hi", "max_tokens": 4})]
    assert httpx.post(server + bodies[0][0], json={**hi, **bodies[0][1]}, timeout=60).status_code == 200   # loaded
    calls = []
    for name, home in (("knob_values", params), ("layered", sampling_defaults)):
        real = getattr(home, name)

        def counted(*args, real=real, name=name, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        for module in [m for m in list(sys.modules.values()) if getattr(m, "__dict__", {}).get(name) is real]:
            monkeypatch.setattr(module, name, counted)          # every module that imported it
    for path, body in bodies:
        calls.clear()
        r = httpx.post(server + path, json={**hi, **body}, timeout=60)
        assert r.status_code == 200 and sorted(calls) == ["knob_values", "layered"], (path, body, calls)


def test_unknown_routes_answer_openais_404_naming_the_routes_served(server, client):
    """An unknown route answered a bare "Not Found"; OpenAI routes not built here (embeddings, images,
    audio, assistants) say what they are, and every 404 names the routes served."""
    import httpx

    for method, path, what in [("POST", "/v1/embeddings", "embeddings"),
                               ("POST", "/v1/images/generations", "image generation"),
                               ("POST", "/v1/audio/transcriptions", "audio"),
                               ("GET", "/v1/assistants", "the Assistants API"), ("GET", "/v1/nope", "no such route")]:
        r = httpx.request(method, server + path, json={"model": "tiny", "input": "hi"})
        assert r.status_code == 404, path
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert error["message"].startswith(f"Invalid URL ({method} {path}): {what}")
        assert "POST /v1/chat/completions" in error["message"] and "GET /v1/models" in error["message"]
        assert "/openapi.json" not in error["message"]
    with pytest.raises(openai.NotFoundError, match="embeddings is not served"):
        client.embeddings.create(model="tiny", input="hi")
    r = httpx.get(server + "/v1/chat/completions")                # a served route, asked with another method
    assert r.status_code == 405 and "takes POST" in r.json()["error"]["message"]
