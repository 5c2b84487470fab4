"""``quantization`` at the framework front doors: a model option that picks the engine (never a
decoding knob), checked when the adapter is built, and part of what the adapters' handles key on, so
two adapters asking for different methods never answer from the same weights."""

import os

import pytest
from tests.helpers import make_chat_checkpoint

from dlm_backend.adapters.common import Handles
from dlm_backend.engine import shared_engines as shared
from dlm_backend.engine.quant.methods import METHODS
from dlm_backend.errors import DLMError


@pytest.fixture
def fresh_model(tmp_path):
    """A checkpoint at a path no other test loads, so its engines' lives are this test's alone."""
    return str(make_chat_checkpoint(tmp_path / "m", "dream"))


def _engines(model: str) -> list:
    return [key for key in shared.loaded() if model in str(key[0])]


def test_handles_key_engines_by_quantization(fresh_model):
    handles = Handles()
    full, int4, fp8 = (handles.get(fresh_model, quantization=q) for q in (None, "int4", "fp8"))
    assert handles.get(fresh_model, None, "int4") is int4 and handles.get(fresh_model) is full
    assert len({id(full.engine), id(int4.engine), id(fp8.engine)}) == 3 == len(_engines(fresh_model))
    assert (int4.config.quantization, fp8.config.quantization, full.config.quantization) == ("int4", "fp8", None)
    assert int4.engine.memory.quantized and fp8.engine.memory.quantized and not full.engine.memory.quantized
    assert handles.loaded(fresh_model, quantization="int4") is int4 and handles.loaded(fresh_model, None, "int8") is None
    handles.close()
    assert not _engines(fresh_model)


def test_langchain_chat_dlm_quantizes_its_engine(fresh_model):
    pytest.importorskip("langchain_core", reason="install the [langchain] extra")
    from dlm_backend.adapters.langchain import ChatDLM

    knobs = dict(model=fresh_model, max_tokens=4, block_length=4)
    full, int4 = ChatDLM(**knobs), ChatDLM(quantization="int4", **knobs)
    assert int4.invoke("hi").response_metadata["finish_reason"] and full.invoke("hi").content is not None
    (engine,) = [llm.engine for llm in int4._handles._llms.values()]
    assert engine.config.quantization == "int4" and engine.memory.quantized
    assert len(_engines(fresh_model)) == 2                   # not the full-precision model's engine
    assert int4._identifying_params["quantization"] == "int4"    # LangChain's response cache keeps them apart
    assert int4.get_token_ids("hello") == full.get_token_ids("hello")
    int4.close()
    full.close()
    with pytest.raises(DLMError, match="quantization 'int3'") as refused:
        ChatDLM(quantization="int3")
    assert all(name in str(refused.value) for name in METHODS)
    assert all(f"{name} ({what})" in ChatDLM.model_fields["quantization"].description for name, what in METHODS.items())


def test_llamaindex_dlm_quantizes_its_engine(fresh_model):
    pytest.importorskip("llama_index.core", reason="install the [llamaindex] extra")
    from dlm_backend.adapters.llamaindex import DLM

    llm = DLM(model=fresh_model, quantization="fp8", max_tokens=4, block_length=4)
    assert not _engines(fresh_model)                         # construction loads nothing
    assert llm.complete("hi").raw["finish_reason"]
    assert llm._llm.config.quantization == "fp8" and llm._llm.engine.memory.quantized
    llm.close()
    assert not _engines(fresh_model)
    with pytest.raises(DLMError, match="quantization 'int3'") as refused:
        DLM(quantization="int3")
    assert all(name in str(refused.value) for name in METHODS)
    assert all(f"{name} ({what})" in DLM.model_fields["quantization"].description for name, what in METHODS.items())


def test_litellm_takes_quantization_as_a_model_option_not_a_knob(fresh_model):
    """Given to ``completion`` or in a Router's ``litellm_params``, LiteLLM hands it over among the
    ``optional_params``; the provider takes it out before the knobs are read."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm", reason="install the [litellm] extra")
    from dlm_backend.adapters.litellm import provider

    call = dict(model=f"dlm/{fresh_model}", messages=[{"role": "user", "content": "hi"}], max_tokens=4, block_length=4)
    try:
        assert litellm.completion(quantization="int8", **call).choices[0].message.content is not None
        router = litellm.Router(model_list=[{"model_name": "q4", "litellm_params": {
            "model": call["model"], "quantization": "int4"}}])
        assert router.completion(**{**call, "model": "q4"}).choices[0].finish_reason
        assert litellm.completion(**call).choices[0].finish_reason
        held = {key[2]: llm for key, llm in provider.handles._llms.items() if key[0] == fresh_model}
        assert set(held) == {"int8", "int4", None} and len(_engines(fresh_model)) == 3
        assert all(llm.config.quantization == q and bool(llm.engine.memory.quantized) == (q is not None)
                   for q, llm in held.items())
        with pytest.raises(litellm.BadRequestError, match="quantization 'int3'") as refused:
            litellm.completion(quantization="int3", **call)
        assert refused.value.body["param"] == "quantization"
    finally:
        provider.close()
    assert not _engines(fresh_model)
