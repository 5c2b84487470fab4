"""The LiteLLM provider: registration on import, completion, streaming, async, extra knobs."""

import asyncio
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="install the [litellm] extra")

import dlm_backend.adapters.litellm  # noqa: E402,F401  (registers the dlm provider)


def test_registration_is_one_import_and_patches_nothing():
    code = ("import os; os.environ['LITELLM_LOCAL_MODEL_COST_MAP']='True'\n"
            "import sys; finders = list(sys.meta_path)\n"
            "import dlm_backend\nassert 'litellm' not in sys.modules and sys.meta_path == finders\n"
            "import litellm\nassert not any(e['provider'] == 'dlm' for e in litellm.custom_provider_map or [])\n"
            "import dlm_backend.adapters.litellm as a; a.register(); a.register()\n"
            "assert sum(e['provider'] == 'dlm' for e in litellm.custom_provider_map) == 1\n"
            "print(litellm.get_model_info('dlm/dlm-tiny')['supports_function_calling'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("True")


def test_completion_stream_and_async(dream_chat):
    model = f"dlm/{dream_chat}"
    messages = [{"role": "user", "content": "hi"}]
    knobs = {"max_tokens": 16, "block_length": 8, "sampler": "llada", "steps": 16, "kv_cache": "none"}
    r = litellm.completion(model=model, messages=messages, **knobs)
    text = r.choices[0].message.content
    assert isinstance(text, str) and r.usage.completion_tokens > 0 and r.choices[0].finish_reason in ("stop", "length")
    chunks = list(litellm.completion(model=model, messages=messages, stream=True, **knobs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    a = asyncio.run(litellm.acompletion(model=model, messages=messages, **knobs))
    assert a.choices[0].message.content == text

    async def astream():
        resp = await litellm.acompletion(model=model, messages=messages, stream=True, **knobs)
        return [c async for c in resp]
    assert "".join(c.choices[0].delta.content or "" for c in asyncio.run(astream())) == text


def test_forced_tool_call_reaches_the_engine(dream_chat):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
    r = litellm.completion(model=f"dlm/{dream_chat}", messages=[{"role": "user", "content": "time?"}], tools=tools,
                           tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=64,
                           block_length=8)
    assert r.choices[0].finish_reason == "tool_calls"       # the forced call is a skeleton: it always parses
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time" and call.function.arguments == "{}"


def test_streamed_tool_call(dream_chat):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    kwargs = dict(model=f"dlm/{dream_chat}", messages=[{"role": "user", "content": "weather?"}], tools=tools,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=96,
                  block_length=16, stream=True)
    for chunks in (list(litellm.completion(**kwargs)),
                   asyncio.run(_collect(litellm.acompletion(**kwargs)))):
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        # A forced call streams as written: its name in the first chunk, argument text after.
        assert calls[0].function.name == "get_weather" and all(not tc.function.name for tc in calls[1:])
        assert set(json.loads("".join(tc.function.arguments for tc in calls))) == {"city"}, chunks


async def _collect(response):
    return [c async for c in await response]


def test_aliases_name_the_embedded_model_and_the_default():
    from dlm_backend.adapters.litellm import model_path
    from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL

    assert model_path("dlm/dlm-tiny") == str(EMBEDDED_MODEL)     # even with $DLM_MODEL set
    assert model_path("dlm/default") is None                      # $DLM_MODEL, else dlm-tiny
    assert model_path("dlm/GSAI-ML/LLaDA-8B-Instruct") == "GSAI-ML/LLaDA-8B-Instruct"
    assert litellm.get_model_info("dlm/dlm-tiny")["max_input_tokens"] == 2048   # from its config.json


@pytest.mark.parametrize("extra,param,match", [
    ({"n": 3}, "n", "n=3 is not supported: one choice per request"),
    ({"echo": True}, "echo", "echo=True is not supported"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions", "pass tools"),
])
def test_fields_the_backend_does_not_serve_are_errors_not_dropped(dream_chat, extra, param, match):
    """They reached the handler and were dropped: n=3 gave one choice, with no word. Refused, they are LiteLLM's UnsupportedParamsError (a BadRequestError), as for a built-in
    provider that lacks the parameter: an APIConnectionError before, which a Router retried."""
    with pytest.raises(litellm.UnsupportedParamsError, match=match) as err:
        litellm.completion(model=f"dlm/{dream_chat}", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                           **extra)
    assert err.value.status_code == 400 and err.value.param == param and err.value.llm_provider == "dlm"


@pytest.mark.parametrize("how", ["call", "global"])
def test_drop_params_drops_what_the_backend_does_not_serve(dream_chat, how, monkeypatch):
    """``drop_params`` (on the call, or ``litellm.drop_params``) drops unsupported OpenAI parameters
    as LiteLLM does for its built-in providers; they were refused all the same. A misspelled knob is
    not an OpenAI parameter: it is still refused."""
    extra = {"drop_params": True} if how == "call" else {}
    if how == "global":
        monkeypatch.setattr(litellm, "drop_params", True)
    for kwargs in ({"n": 3}, {"logit_bias": {"12": 5}, "best_of": 2}, {"presence_penalty": 0.5},
                   {"stream": True, "n": 2}):
        reply = litellm.completion(model=f"dlm/{dream_chat}", messages=HI, max_tokens=8, **extra, **kwargs)
        text = "".join(c.choices[0].delta.content or "" for c in reply) if kwargs.get("stream") else \
            reply.choices[0].message.content
        assert isinstance(text, str)
    with pytest.raises(litellm.BadRequestError, match="thresold"):
        litellm.completion(model=f"dlm/{dream_chat}", messages=HI, max_tokens=8, thresold=0.9, **extra)


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("how", ["completion", "acompletion", "stream", "astream"])
@pytest.mark.parametrize("extra,error,status,param", [
    ({"n": 2}, "UnsupportedParamsError", 400, "n"),
    ({"temperature": 5}, "BadRequestError", 400, "temperature"),       # OpenAI's maximum is 2
    ({"max_tokens": 100_000}, "ContextWindowExceededError", 400, "max_tokens"),
    ({"model": "dlm//no/such/model"}, "NotFoundError", 404, None),
])
def test_errors_are_litellms_own_types(dream_chat, how, extra, error, status, param):
    kwargs = {"model": f"dlm/{dream_chat}", "messages": HI, "max_tokens": 8, **extra}

    async def astream():
        return [c async for c in await litellm.acompletion(stream=True, **kwargs)]
    calls = {"completion": lambda: litellm.completion(**kwargs), "stream": lambda: list(litellm.completion(stream=True, **kwargs)),
             "acompletion": lambda: asyncio.run(litellm.acompletion(**kwargs)), "astream": lambda: asyncio.run(astream())}
    with pytest.raises(getattr(litellm, error)) as err:
        calls[how]()
    assert err.value.status_code == status and err.value.llm_provider == "dlm"
    if param:
        assert err.value.param == param


def test_a_router_neither_retries_nor_falls_back_on_a_refused_request(dream_chat):
    """A refusal surfaced as APIConnectionError: the Router retried it num_retries times, then
    answered from the fallback. As a BadRequestError it is tried once, and with
    fallback_on_unsupported_params=False (LiteLLM's switch for exactly this) never falls back."""
    import dlm_backend.adapters.litellm as adapter

    calls = []
    original = adapter.provider.completion

    def counted(*args, **kwargs):
        calls.append(kwargs.get("optional_params"))
        return original(*args, **kwargs)

    adapter.provider.completion = counted
    try:
        for fallback in (True, False):
            calls.clear()
            router = litellm.Router(model_list=[
                {"model_name": "dlm", "litellm_params": {"model": f"dlm/{dream_chat}", "max_tokens": 8}},
                {"model_name": "backup", "litellm_params": {"model": "openai/gpt-4o", "api_key": "unused",
                                                            "mock_response": "from the backup"}}],
                fallbacks=[{"dlm": ["backup"]}], num_retries=2, fallback_on_unsupported_params=fallback)
            if fallback:                    # LiteLLM's default: any error goes to the fallback, once
                assert router.completion(model="dlm", messages=HI, n=2).choices[0].message.content == "from the backup"
            else:
                with pytest.raises(litellm.BadRequestError, match="n=2 is not supported"):
                    router.completion(model="dlm", messages=HI, n=2)
            assert len(calls) == 1                                        # not retried
        assert router.completion(model="dlm", messages=HI).choices[0].message.content != "from the backup"
    finally:
        adapter.provider.completion = original


def test_import_prints_no_cost_map_warnings():
    """register_model warned for each dlm/ entry: a custom price without the cache prices."""
    code = ("import os; os.environ['LITELLM_LOCAL_MODEL_COST_MAP'] = 'True'\n"
            "import litellm, dlm_backend.adapters.litellm\n"
            "print(litellm.model_cost['dlm/dlm-tiny']['input_cost_per_token'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.0" and "WARNING" not in out.stderr + out.stdout, out.stderr
