"""`dlm serve --quantization`: checked when the server starts, applied when the model loads, and
reported with the memory it took by ``/v1/models``."""

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")

from dlm_backend.engine.quant.methods import METHODS  # noqa: E402
from dlm_backend.errors import DLMError  # noqa: E402
from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.server.settings import ServerConfig  # noqa: E402


def test_a_method_the_engine_does_not_apply_stops_the_server_config_naming_the_ones_it_does():
    """Checked in ServerConfig, as dtype is, so `dlm serve --lazy` fails at start, not at a request."""
    with pytest.raises(DLMError, match="quantization 'int3'") as refused:
        ServerConfig(quantization="int3")
    assert all(name in str(refused.value) for name in METHODS)
    assert ServerConfig(quantization="fp8").quantization == "fp8"


def test_the_model_card_reports_the_quantization_and_once_loaded_the_memory():
    from fastapi.testclient import TestClient

    app = create_app(config=ServerConfig(served_name="tiny", quantization="int8"))
    with TestClient(app, base_url="http://localhost") as client:
        before = client.get("/v1/models").json()["data"][0]
        assert before["id"] == "tiny" and before["dlm"] == {"quantization": "int8"}     # lazy: nothing loaded yet
        engine = app.state.llm().engine
        assert engine.config.quantization == "int8"
        card = client.get("/v1/models/tiny").json()
        assert card == client.get("/v1/models").json()["data"][0]
        memory = card["dlm"]["memory"]
        assert card["dlm"]["quantization"] == "int8" and memory["quantized"] == engine.memory.quantized
        assert memory["quantized"] and all(kind.startswith("int8") for kind in memory["quantized"])
        assert (memory["weight_bytes"], memory["kv_cache_bytes"], memory["kv_pages"], memory["page_size"]) == (
            engine.memory.weight_bytes, engine.memory.kv_cache_bytes, engine.memory.kv_pages, engine.memory.page_size)
        assert "tiny loaded on" in app.state.served.summary() and "(quantization int8)" in app.state.served.summary()
