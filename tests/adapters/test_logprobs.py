"""Token logprobs at the framework front doors, where each framework's OpenAI integration puts them
(LangChain ``response_metadata["logprobs"]``, LiteLLM ``choices[0].logprobs``, LlamaIndex
``ChatResponse.logprobs``), and canvas frames where a stream type has room for them."""

import math

import pytest

QUESTION = "What is the capital of France?"


def _check(entries, top: int) -> None:
    assert entries and all(e["logprob"] <= 0 and len(e["top_logprobs"]) == top for e in entries)
    for e in entries:
        assert e["bytes"] == list(e["token"].encode()) or e["token"] == "\ufffd"
        assert not top or e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6


def test_langchain_puts_them_where_chatopenai_does():
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    model = ChatDLM(max_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=2)
    reply = model.invoke(QUESTION)
    _check(reply.response_metadata["logprobs"]["content"], 2)
    assert len(reply.response_metadata["logprobs"]["content"]) == reply.usage_metadata["output_tokens"] == 12
    streamed = None
    for chunk in model.stream(QUESTION):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.response_metadata["logprobs"]["content"] == reply.response_metadata["logprobs"]["content"]
    plain = ChatDLM(max_tokens=8, logprobs=False).invoke(QUESTION)
    assert "logprobs" not in plain.response_metadata
    per_call = ChatDLM(max_tokens=8).invoke(QUESTION, logprobs=True)
    _check(per_call.response_metadata["logprobs"]["content"], 0)
    with pytest.raises(Exception, match="top_logprobs needs logprobs=true"):
        ChatDLM(max_tokens=8, top_logprobs=2)


def test_langchain_streams_canvas_frames_when_asked():
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    full = None
    for chunk in ChatDLM(max_tokens=12, stream_canvas=True).stream(QUESTION):
        full = chunk if full is None else full + chunk
    frames = full.response_metadata["dlm_canvas"]
    assert [f["pass"] for f in frames] == list(range(1, len(frames) + 1))
    assert full.response_metadata["num_forward_passes"] == len(frames)


def test_litellm_puts_them_in_the_choice():
    litellm = pytest.importorskip("litellm")
    import dlm_backend.adapters.litellm  # noqa: F401 - registers the provider

    r = litellm.completion(model="dlm/dlm-tiny", messages=[{"role": "user", "content": QUESTION}], max_tokens=12,
                           ignore_eos=True, logprobs=True, top_logprobs=3)
    entries = [t.model_dump() for t in r.choices[0].logprobs.content]
    _check(entries, 3)
    assert len(entries) == r.usage.completion_tokens
    plain = litellm.completion(model="dlm/dlm-tiny", messages=[{"role": "user", "content": QUESTION}], max_tokens=8)
    assert getattr(plain.choices[0], "logprobs", None) is None


def test_llamaindex_gives_each_token_its_alternatives():
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from dlm_backend.adapters.llamaindex import DLM

    llm = DLM(max_tokens=12, logprobs=True, top_logprobs=2, additional_kwargs={"ignore_eos": True})
    r = llm.chat([ChatMessage(role="user", content=QUESTION)])
    assert len(r.logprobs) == r.raw["usage"]["completion_tokens"] == 12
    assert all(len(alts) == 2 and all(a.logprob <= 0 for a in alts) for alts in r.logprobs)
    streamed = [lp for c in llm.stream_chat([ChatMessage(role="user", content=QUESTION)]) if c.delta
                for lp in c.logprobs or []]
    assert [[(a.token, a.logprob) for a in alts] for alts in streamed] == \
        [[(a.token, a.logprob) for a in alts] for alts in r.logprobs]
    assert DLM(max_tokens=8).chat([ChatMessage(role="user", content=QUESTION)]).logprobs is None
    frames = [f for c in DLM(max_tokens=12, stream_canvas=True).stream_chat([ChatMessage(role="user", content=QUESTION)])
              for f in c.additional_kwargs.get("dlm_canvas", [])]
    assert frames and all(math.isfinite(f["pass"]) for f in frames)
