"""langchain-tests' standard integration suite for ChatDLM, run against the embedded dlm-tiny.

The xfails are the model's, not the adapter's: each needs dlm-tiny to use a tool outside its
training catalog (magic_function, get_weather(location)), to write non-ASCII, or to write free-form
JSON with fields it was never shown (recipes/dlm_tiny/findings.md). Structure the adapter controls
(forced tool calls, json_schema output) passes.
"""

import atexit
import functools
import inspect
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("langchain_tests", reason="install the [langchain] extra and langchain-tests")

from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402

from tests.adapters.langchain_common import ChatDLMSuite  # noqa: E402

COPY = ("model capability: the forced call always parses (the engine writes its structure), but dlm-tiny fills "
        "an unseen tool's arguments wrongly (magic_function(3) does not get input 3): with the structure forced it "
        "copies the right values into 1 of 48 hand-written tool calls (recipes/dlm_tiny/findings.md)")


def xfail(test, reason: str):
    """The suite's test, marked xfail on this class only, keeping its own parametrization."""
    if inspect.iscoroutinefunction(test):
        async def wrapper(self, *args, **kwargs):
            return await test(self, *args, **kwargs)
    else:
        def wrapper(self, *args, **kwargs):
            return test(self, *args, **kwargs)
    return pytest.mark.xfail(reason=reason)(functools.wraps(test)(wrapper))


@functools.cache
def _other_checkpoint() -> str:
    """A second model for the per-call `model` override tests (random weights, built once)."""
    from tests.helpers import make_chat_checkpoint

    folder = Path(tempfile.mkdtemp(prefix="dlm-override-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(make_chat_checkpoint(folder / "other-dlm", "dream"))


class TestChatDLMIntegration(ChatDLMSuite, ChatModelIntegrationTests):
    @property
    def model_override_value(self):
        return _other_checkpoint()

    @property
    def chat_model_params(self):
        # No diffusion knobs: the suite runs as a user's code does, at the checkpoint's own defaults
        # (dlm-tiny: threshold 0.95, block 4, prefix cache; generation_config.json).
        return {}

    test_tool_calling = xfail(ChatModelIntegrationTests.test_tool_calling, COPY)
    test_tool_calling_async = xfail(ChatModelIntegrationTests.test_tool_calling_async, COPY)
    test_unicode_tool_call_integration = xfail(
        ChatModelIntegrationTests.test_unicode_tool_call_integration,
        "model capability: dlm-tiny's corpus is ASCII, so it has never written the byte pieces of '你好' and "
        "fills the argument with an ASCII word instead")
    test_agent_loop = xfail(ChatModelIntegrationTests.test_agent_loop,
                            "model capability: dlm-tiny picks get_weather but fills it with an argument key from its "
                            "training schemas, {'restaurant': 'San Francisco'}, not the suite's 'location', and the "
                            "tool rejects the call (a pydantic ValidationError)")
    test_json_mode = xfail(ChatModelIntegrationTests.test_json_mode,
                           "model capability: json_mode has no schema to template, and dlm-tiny's free-form "
                           "JSON for the Joke request has keys from its training schemas (name, price, color), "
                           "not setup and punchline, so the reply fails the Joke schema")
