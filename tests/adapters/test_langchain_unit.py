"""langchain-tests' standard unit suite for ChatDLM (construction, params, tools, structured output)."""

import pytest

pytest.importorskip("langchain_tests", reason="install the [langchain] extra and langchain-tests")

from langchain_tests.unit_tests import ChatModelUnitTests  # noqa: E402

from dlm_backend.adapters.langchain import ChatDLM  # noqa: E402


class TestChatDLMUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self):
        return ChatDLM

    @property
    def chat_model_params(self):
        return {"model": "tests/fixtures/parity/dream-tiny", "block_length": 8}

    @property
    def init_from_env_params(self):
        return ({"DLM_MODEL": "tests/fixtures/parity/dream-tiny"}, {}, {})

    @property
    def has_tool_choice(self):
        return True

    @property
    def supports_json_mode(self):
        return True
