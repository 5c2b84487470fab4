"""langchain-tests' standard integration suite for ChatDLM, run against the embedded dlm-tiny."""

import pytest

pytest.importorskip("langchain_tests", reason="install the [langchain] extra and langchain-tests")

from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402

from tests.adapters.langchain_common import ChatDLMSuite  # noqa: E402
from dlm_backend.engine.loader import EMBEDDED_MODEL  # noqa: E402

pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "model.safetensors").is_file(),
                                reason="the embedded model is not built (run `dlm train`)")


class TestChatDLMIntegration(ChatDLMSuite, ChatModelIntegrationTests):
    @property
    def chat_model_params(self):
        return {"block_length": 32, "sampler": "threshold", "threshold": 0.9, "kv_cache": "dual"}
