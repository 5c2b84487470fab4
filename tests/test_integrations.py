"""Every integration scenario runs green on the embedded model, as a user would run it."""

import importlib
import importlib.util
import os
from pathlib import Path

import pytest

from dlm_backend.engine.loader import EMBEDDED_MODEL

ROOT = Path(__file__).resolve().parents[1] / "integrations"
pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "model.safetensors").is_file(),
                                reason="the embedded model is not built (run `dlm train`)")


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_llamaindex_rag():
    pytest.importorskip("llama_index.retrievers.bm25")
    module = load("llamaindex_rag")
    answers = module.main()
    correct = sum(expected.lower() in answers[q].lower() for q, expected in module.QUESTIONS.items())
    assert correct == len(module.QUESTIONS), answers
    assert "tarnhollow" in answers["chat: Where does Velmora live?"].lower()


def test_llamaindex_function_agent():
    calls, answer = load("llamaindex_agent").main()
    assert calls and calls[0][0] == "get_population" and calls[0][1] == {"city": "Brambleton"}
    assert "73500" in answer


def test_langchain_agent():
    pytest.importorskip("langchain.agents")
    state = load("langchain_agent").main("What's the weather in Lisbon?")
    kinds = [m.type for m in state["messages"]]
    assert kinds[:3] == ["human", "ai", "tool"] and kinds[-1] == "ai"
    call = state["messages"][1].tool_calls[0]
    assert call["name"] == "get_weather" and call["args"] == {"city": "Lisbon"}
    assert "21" in state["messages"][-1].content


def test_litellm_completion():
    out = load("litellm_completion").main()
    assert "dlm-tiny" in out["answer"].choices[0].message.content
    assert out["streamed"].strip() == "42"
    call = out["tool_call"].choices[0].message.tool_calls[0]
    assert call.function.name == "get_time" and '"Oslo"' in call.function.arguments


def test_litellm_proxy_config_resolves_the_handler():
    import yaml
    config = yaml.safe_load((ROOT / "litellm_proxy_config.yaml").read_text())
    entry = config["litellm_settings"]["custom_provider_map"][0]
    module, _, attr = entry["custom_handler"].rpartition(".")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    handler = getattr(importlib.import_module(module), attr)
    assert entry["provider"] == "dlm" and hasattr(handler, "acompletion") and hasattr(handler, "astreaming")
    assert config["model_list"][0]["litellm_params"]["model"] == "dlm/dlm-tiny"


def test_openai_client_against_dlm_serve():
    out = load("openai_client").main()
    assert out["chat"].choices[0].message.content
    assert out["streamed"].strip() == "4, 7, 9"
    call = out["tool_call"].choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "Kyoto" in call.function.arguments
