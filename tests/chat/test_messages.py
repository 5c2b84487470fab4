"""Messages (chat/messages.py): every framework's message shapes as the chat templates read them."""

import pytest

from dlm_backend import DLMError
from dlm_backend.chat import normalize_messages


def test_normalize_messages_handles_framework_shapes():
    msgs = normalize_messages([
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert msgs[3]["tool_call_id"] == "c1" and msgs[1]["name"] == "bob"


@pytest.mark.parametrize("bad,match", [
    ([], "empty"),
    ([{"role": "wizard", "content": "x"}], "Unknown message role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "text only"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}], "not valid JSON"),
])
def test_bad_messages_are_clear_errors(bad, match):
    with pytest.raises(DLMError, match=match):
        normalize_messages(bad)
