"""langchain-tests' standard unit suite for ChatDLM (construction, params, tools, structured output)."""

import pytest

pytest.importorskip("langchain_tests", reason="install the [langchain] extra and langchain-tests")

from langchain_tests.unit_tests import ChatModelUnitTests  # noqa: E402

from tests.adapters.langchain_common import ChatDLMSuite  # noqa: E402


class TestChatDLMUnit(ChatDLMSuite, ChatModelUnitTests):
    @property
    def chat_model_params(self):
        return {"model": "tests/fixtures/parity/dream-tiny", "block_length": 8}

    @property
    def init_from_env_params(self):
        return ({"DLM_MODEL": "tests/fixtures/parity/dream-tiny"}, {}, {})
