"""langchain-tests' standard integration suite for ChatDLM, run against the embedded dlm-tiny."""

import pytest

pytest.importorskip("langchain_tests", reason="install the [langchain] extra and langchain-tests")

from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402

from dlm_backend.adapters.langchain import ChatDLM  # noqa: E402
from dlm_backend.engine.loader import EMBEDDED_MODEL  # noqa: E402

pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "model.safetensors").is_file(),
                                reason="the embedded model is not built (run `dlm train`)")


class TestChatDLMIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self):
        return ChatDLM

    @property
    def chat_model_params(self):
        return {"block_length": 32, "sampler": "threshold", "threshold": 0.9, "kv_cache": "dual"}

    @property
    def has_tool_choice(self):
        return True

    @property
    def supports_json_mode(self):
        return True
