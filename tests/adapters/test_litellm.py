"""The LiteLLM provider: registration on import, completion, streaming, async, extra knobs."""

import asyncio
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
        assert [tc.function.name for tc in calls] == ["get_weather"], chunks


async def _collect(response):
    return [c async for c in await response]


def test_aliases_name_the_embedded_model_and_the_default():
    from dlm_backend.adapters.litellm import _model_path
    from dlm_backend.engine.loader import EMBEDDED_MODEL

    assert _model_path("dlm/dlm-tiny") == str(EMBEDDED_MODEL)     # even with $DLM_MODEL set
    assert _model_path("dlm/default") is None                      # $DLM_MODEL, else dlm-tiny
    assert _model_path("dlm/GSAI-ML/LLaDA-8B-Instruct") == "GSAI-ML/LLaDA-8B-Instruct"
    assert litellm.get_model_info("dlm/dlm-tiny")["max_input_tokens"] == 2048   # from its config.json


@pytest.mark.parametrize("extra,match", [
    ({"n": 3}, "n=3 is not supported: one choice per request"),
    ({"logprobs": True}, "logprobs=True is not supported"),
    ({"top_logprobs": 2, "logprobs": False}, "top_logprobs=2 is not supported"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "pass tools"),
])
def test_fields_the_backend_does_not_serve_are_errors_not_dropped(dream_chat, extra, match):
    """They reached the handler and were dropped: n=3 gave one choice, logprobs=True none, with no word."""
    with pytest.raises(Exception, match=match):
        litellm.completion(model=f"dlm/{dream_chat}", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                           **extra)
