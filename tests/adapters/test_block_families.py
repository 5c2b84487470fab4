"""Every front door on the block-diffusion families: LLaDA2 (Ling chat format, the mask id from the
tokenizer), SDAR and Fast-dLLM v2 (ChatML), DiffusionGemma (Gemma turns, uniform noise: no mask
token at all), Nemotron-Labs-Diffusion (Mistral turns, causal context), WeDLM (ChatML, reordered causal passes), tiny checkpoints in their official formats with a tokenizer and chat template. The weights are random, so what is checked is the plumbing: text and
streams agree, forced tool calls and skeleton structured output parse, knobs reach the engine.
DiffusionGemma has no greedy mode (every step samples), so requests compared with each other are
seeded (the seed changes nothing for the greedy families)."""

import asyncio
import json

import pytest
from tests.helpers import make_block_chat_checkpoint, serve_in_thread

from dlm_backend import LLM

FAMILIES = ["llada2", "sdar", "fastdllm2", "diffusiongemma", "nemotron", "wedlm"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module", params=FAMILIES)
def block_chat(request, tmp_path_factory):
    return make_block_chat_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def test_llm_chat_and_stream_agree_and_use_the_family_sampler(block_chat):
    llm = LLM(str(block_chat))
    family = json.loads((block_chat / "config.json").read_text())["architectures"][0]
    params = llm.sampling_params(max_tokens=24, seed=7)
    assert params.sampler == {"LLaDA2MoeModelLM": "llada2", "SDARForCausalLM": "sdar",
                              "Fast_dLLM_QwenForCausalLM": "fastdllm2",
                              "DiffusionGemmaForBlockDiffusion": "diffusiongemma",
                              "NemotronLabsDiffusionModel": "nemotron", "WeDLMForCausalLM": "wedlm"}[family]
    messages = [{"role": "user", "content": "Name three colors."}]
    out = llm.chat(messages, params)
    assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= 24
    chunks = list(llm.stream_chat(messages, params))
    assert "".join(c.delta_text for c in chunks) == out.text and chunks[-1].output.token_ids == out.token_ids


def test_a_sampler_of_another_family_is_refused_naming_this_ones(block_chat, llada_dir):
    """``sampler="llada"`` on an SDAR or LLaDA2 checkpoint decoded silently with LLaDA's rule; each
    sampler now names the schedules its reference decodes, and another family's is refused."""
    from dlm_backend import DLMError

    llm = LLM(str(block_chat))
    own = llm.sampling_params().sampler
    for foreign in ("llada", "dream"):
        with pytest.raises(DLMError, match=f"'{foreign}'.*{own}") as refused:
            llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=llm.sampling_params(sampler=foreign, max_tokens=8))
        assert refused.value.param == "sampler" and "'full'" in str(refused.value)
    llm.close()
    with LLM(str(llada_dir)) as full:                 # and the other way round
        with pytest.raises(DLMError, match="Use one of its family's samplers: .*llada") as refused:
            full.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=full.sampling_params(sampler=own, max_tokens=8))
        assert own not in str(refused.value).split("samplers:")[1]


def test_server_chat_streaming_tools_and_schema(block_chat):
    openai = pytest.importorskip("openai")
    from dlm_backend.server import create_app

    with serve_in_thread(create_app(str(block_chat), served_name="block")) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        kwargs = dict(model="block", messages=[{"role": "user", "content": "hi"}], max_tokens=16, seed=7)
        r = client.chat.completions.create(**kwargs)
        streamed = list(client.chat.completions.create(stream=True, **kwargs))
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content
        r = client.chat.completions.create(model="block", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                           tools=TOOLS, tool_choice=FORCED, max_tokens=96)
        call = r.choices[0].message.tool_calls[0]
        # random weights may run a string to the budget: the call still comes, flagged "length"
        assert r.choices[0].finish_reason in ("tool_calls", "length") and call.function.name == "get_weather"
        assert set(json.loads(call.function.arguments)) == {"city"}
        r = client.chat.completions.create(
            model="block", messages=[{"role": "user", "content": "Bob is 3."}], max_tokens=128,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
        person = json.loads(r.choices[0].message.content)
        assert set(person) == {"name", "age"} and isinstance(person["age"], int)
        # A full-sequence family's sampler is refused (it decoded silently), naming this family's own
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(extra_body={"sampler": "llada"}, **kwargs)
        assert refused.value.body["param"] == "sampler"
        assert LLM(str(block_chat)).sampling_params().sampler in refused.value.body["message"]
        # An agent's long system prompt is computed once: the second request finds its pages cached
        # (not DiffusionGemma's: a prompt encoded in two pieces differs in the last bits, which its
        # self-conditioned steps turn into other tokens, so the same seed would not give the same text).
        uniform = json.loads((block_chat / "config.json").read_text())["architectures"] == [
            "DiffusionGemmaForBlockDiffusion"]
        system = {"role": "system", "content": "You are a careful assistant. " * 12}
        for question in ("What is the capital of France?", "Name three prime numbers."):
            client.chat.completions.create(model="block", messages=[system, {"role": "user", "content": question}],
                                           max_tokens=8)
        import httpx
        metrics = dict(line.rsplit(" ", 1) for line in httpx.get(url + "/metrics").text.splitlines()
                       if line and not line.startswith("#"))
        if uniform:
            assert float(metrics["dlm_prefix_cache_hits_total"]) == 0 and float(metrics["dlm_kv_cache_pages"]) > 0
        else:
            assert float(metrics["dlm_prefix_cache_hits_total"]) >= 4
            assert 0 < float(metrics["dlm_prefix_cache_hit_rate"]) <= 1 and float(metrics["dlm_kv_cache_pages"]) > 0


def test_langchain_invoke_stream_tools_and_structured_output(block_chat):
    pytest.importorskip("langchain_core")
    from pydantic import BaseModel

    from dlm_backend.adapters.langchain import ChatDLM

    class Person(BaseModel):
        name: str
        age: int

    chat = ChatDLM(model=str(block_chat), max_tokens=16, seed=7)
    msg = chat.invoke("hi")
    assert "".join(c.content for c in chat.stream("hi")) == msg.content
    called = ChatDLM(model=str(block_chat), max_tokens=96).bind_tools(TOOLS, tool_choice="get_weather").invoke("Oslo?")
    assert called.tool_calls[0]["name"] == "get_weather" and set(called.tool_calls[0]["args"]) == {"city"}
    person = ChatDLM(model=str(block_chat), max_tokens=128).with_structured_output(Person).invoke("Bob is 3.")
    assert isinstance(person, Person)


def test_llamaindex_chat_stream_and_structured_predict(block_chat):
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.prompts import PromptTemplate
    from pydantic import BaseModel

    from dlm_backend.adapters.llamaindex import DLM

    class Person(BaseModel):
        name: str
        age: int

    llm = DLM(model=str(block_chat), max_tokens=16, seed=7)
    r = llm.chat([ChatMessage(role="user", content="hi")])
    assert "".join(s.delta or "" for s in llm.stream_chat([ChatMessage(role="user", content="hi")])) == r.message.content
    assert asyncio.run(llm.achat([ChatMessage(role="user", content="hi")])).message.content == r.message.content
    big = DLM(model=str(block_chat), max_tokens=128)
    assert isinstance(big.structured_predict(Person, PromptTemplate("Who is {who}?"), who="Bob, 3"), Person)


def test_litellm_completion_stream_and_forced_tool(block_chat):
    litellm = pytest.importorskip("litellm")
    import dlm_backend.adapters.litellm  # noqa: F401  (registers dlm/)

    model, messages = f"dlm/{block_chat}", [{"role": "user", "content": "hi"}]
    r = litellm.completion(model=model, messages=messages, max_tokens=16, seed=7)
    chunks = list(litellm.completion(model=model, messages=messages, max_tokens=16, seed=7, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    r = litellm.completion(model=model, messages=[{"role": "user", "content": "Oslo?"}], tools=TOOLS,
                           tool_choice=FORCED, max_tokens=96)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
