"""What every framework adapter owes its users alike: constructor arguments checked against the knob
table when the adapter is built (names and values, no model loaded), knob names read from that
table, no framework globals touched, and an explicit ``close()`` that gives the engine back."""

import pytest
from tests.helpers import make_chat_checkpoint

from dlm_backend import LLM
from dlm_backend.engine import shared_engines as shared
from dlm_backend.errors import DLMError, SamplingParamsError


def chat_dlm():
    pytest.importorskip("langchain_core", reason="install the [langchain] extra")
    from dlm_backend.adapters.langchain import ChatDLM
    return ChatDLM


def llamaindex_dlm():
    pytest.importorskip("llama_index.core", reason="install the [llamaindex] extra")
    from dlm_backend.adapters.llamaindex import DLM
    return DLM


ADAPTERS = [pytest.param(chat_dlm, id="langchain"), pytest.param(llamaindex_dlm, id="llamaindex")]


@pytest.fixture
def fresh_model(tmp_path):
    """A checkpoint at a path no other test loads, so its engine's life is this test's alone."""
    return str(make_chat_checkpoint(tmp_path / "m", "dream"))


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_misspelled_constructor_field_is_refused_with_the_nearest_name(adapter):
    cls = adapter()
    before = len(shared.loaded())
    with pytest.raises(DLMError, match="'thresold'.*Did you mean 'threshold'"):
        cls(thresold=0.5)
    with pytest.raises(DLMError, match="Did you mean 'kv_cache'"):
        cls(kv_cahce="prefix")
    assert len(shared.loaded()) == before


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_knob_aliases_set_the_knob_as_at_the_server_and_litellm(adapter):
    cls = adapter()
    assert cls(max_new_tokens=4).max_tokens == 4
    assert cls(max_completion_tokens=5).max_tokens == 5
    with pytest.raises(DLMError, match="max_new_tokens and max_tokens name the same knob"):
        cls(max_tokens=4, max_new_tokens=8)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("kwargs,match", [
    ({"threshold": 5.0}, r"threshold must be in \(0, 1\]"),
    ({"eps": 5.0}, r"eps must be in \(0, 1\)"),
    ({"kv_cache": "paged"}, "kv_cache must be one of none, prefix, dual"),
    ({"max_tokens": 0}, "max_tokens must be in"),
    ({"stop": [""]}, "stop must be"),
])
def test_knob_values_are_checked_at_construction(adapter, kwargs, match):
    cls = adapter()
    before = len(shared.loaded())
    with pytest.raises(SamplingParamsError, match=match):
        cls(**kwargs)
    assert len(shared.loaded()) == before


def test_langchain_cache_is_its_response_cache_and_the_error_says_kv_cache():
    with pytest.raises(DLMError, match="kv_cache='prefix'"):
        chat_dlm()(cache="prefix")


def test_llamaindex_additional_kwargs_are_checked_at_construction():
    cls = llamaindex_dlm()
    with pytest.raises(DLMError, match="Did you mean 'threshold'"):
        cls(additional_kwargs={"thresold": 0.5})
    with pytest.raises(SamplingParamsError, match="threshold must be in"):
        cls(additional_kwargs={"threshold": 5.0})


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_adapters_name_their_knob_fields_from_the_knob_table(adapter):
    from dlm_backend.engine.params import FRAMEWORK_NAMES, KNOBS

    assert FRAMEWORK_NAMES["cache"] == "kv_cache" and set(FRAMEWORK_NAMES) == set(KNOBS)
    fields = adapter().model_fields
    assert set(FRAMEWORK_NAMES.values()) <= set(fields)
    assert fields["kv_cache"].description.startswith(KNOBS["cache"].doc)  # described by the table


def _answer(model) -> str:
    return model.invoke("hello").content if hasattr(model, "invoke") else model.complete("hello").text


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_close_gives_the_engine_back_and_a_later_call_loads_again(adapter, fresh_model):
    model = adapter()(model=fresh_model, max_tokens=4, block_length=4)
    first = _answer(model)
    assert len(shared.loaded()) and any(fresh_model in str(k[0]) for k in shared.loaded())
    model.close()
    model.close()                                                      # idempotent
    assert not any(fresh_model in str(k[0]) for k in shared.loaded())  # the last handle freed the weights
    assert _answer(model) == first                                     # not "This engine was closed"
    model.close()


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_counting_tokens_reads_the_tokenizer_not_the_weights(adapter, fresh_model):
    """Frameworks count on the event loop (LlamaIndex's aquery, its chat memory): loading the weights
    there stalled a first aquery for 2.6 s. The counts are the loaded engine's all the same."""
    model = adapter()(model=fresh_model, max_tokens=4, block_length=4)
    count = model.get_token_ids if hasattr(model, "get_token_ids") else model.tokenizer
    ids = count("hello there")
    assert not any(fresh_model in str(k[0]) for k in shared.loaded())
    _answer(model)
    with LLM(fresh_model) as loaded:                                   # the engine the adapter loaded
        assert count("hello there") == ids == loaded.tokenizer.encode("hello there")
    model.close()


def test_a_closed_handle_is_never_handed_out(fresh_model):
    from dlm_backend.adapters.common import Handles

    handles = Handles()
    a = handles.get(fresh_model)
    assert handles.get(fresh_model) is a
    a.close()                                                          # closed behind the adapter's back
    b = handles.get(fresh_model)
    assert b is not a and not b.closed
    handles.close()
    assert b.closed


def test_the_litellm_provider_closes_its_engines(fresh_model):
    import os
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm", reason="install the [litellm] extra")
    from dlm_backend.adapters.litellm import provider

    call = dict(model=f"dlm/{fresh_model}", messages=[{"role": "user", "content": "hi"}], max_tokens=4, block_length=4)
    first = litellm.completion(**call).choices[0].message.content
    assert any(fresh_model in str(k[0]) for k in shared.loaded())
    provider.close()
    assert not any(fresh_model in str(k[0]) for k in shared.loaded())
    assert litellm.completion(**call).choices[0].message.content == first      # loads again
    provider.close()


def test_constructing_a_llamaindex_dlm_leaves_its_globals_alone(fresh_model):
    cls = llamaindex_dlm()
    import llama_index.core
    from llama_index.core import Settings
    from llama_index.core.utils import get_tokenizer

    saved = llama_index.core.global_tokenizer
    llama_index.core.global_tokenizer = None
    try:
        llm = cls(model=fresh_model)
        assert llama_index.core.global_tokenizer is None                # construction changed nothing global
        Settings.tokenizer = llm.tokenizer                              # the one documented line
        text = "Diffusion models fill masked tokens in parallel."
        with LLM(fresh_model) as loaded:
            assert get_tokenizer()(text) == llm.tokenizer(text) == loaded.tokenizer.encode(text)
        llm.close()
    finally:
        llama_index.core.global_tokenizer = saved
