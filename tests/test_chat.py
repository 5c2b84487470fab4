"""Tool-call parsing for the Hermes / Qwen2.5 format."""

from dlm_backend.chat import parse_tool_calls


def test_single_call():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
    assert parse_tool_calls(text) == ("", [{"name": "get_weather", "arguments": {"city": "Lisbon"}}], [])


def test_content_and_several_calls_and_string_arguments():
    text = ('Let me check.\n<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    content, calls, bad = parse_tool_calls(text)
    assert content == "Let me check." and bad == []
    assert calls == [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]


def test_malformed_calls_are_reported_not_raised():
    content, calls, bad = parse_tool_calls('<tool_call>{"name": "a", "arguments": {</tool_call>')
    assert calls == [] and len(bad) == 1
    _, calls, bad = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert calls == [] and len(bad) == 1


def test_unterminated_call_still_parses():
    _, calls, _ = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"q": "z"}}')
    assert calls == [{"name": "a", "arguments": {"q": "z"}}]


def test_plain_text_has_no_calls():
    assert parse_tool_calls("Paris.") == ("Paris.", [], [])
