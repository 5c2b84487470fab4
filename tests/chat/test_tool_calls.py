"""Tool calls (chat/tool_calls.py): parsing the Hermes / Qwen2.5 format, tools and tool_choice."""

import pytest
from tests.chat.chat_cases import TIME, WEATHER

from dlm_backend import DLMError
from dlm_backend.chat.tool_calls import normalize_tools, parse_tool_calls, tool_choice_name


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


def test_stray_closers_after_a_complete_call_are_repaired_unless_scoring():
    """Two parallel passes both wrote the closing braces (dlm-tiny, entropy_bounded, Lisbon)."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}"}}\n</tool_call>'
    assert parse_tool_calls(text) == ("", [{"name": "get_weather", "arguments": {"city": "Lisbon"}}], [])
    content, calls, bad = parse_tool_calls(text, repair=False)
    assert calls == [] and bad[0]["name"] == "get_weather" and content == text


def test_words_after_a_call_are_not_repaired_away():
    text = '<tool_call>{"name": "a", "arguments": {}} and also b</tool_call>'
    content, calls, bad = parse_tool_calls(text)
    assert calls == [] and bad[0]["arguments"] == '{"name": "a", "arguments": {}} and also b'


def test_a_malformed_call_stays_in_the_content_and_is_reported():
    text = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    content, calls, bad = parse_tool_calls(text)
    assert content == text and calls == []
    assert bad == [{"name": "get_weather", "arguments": '{"name": "get_weather", "arguments": {"city":',
                    "error": bad[0]["error"], "text": text[len("Checking. "):]}]
    assert bad[0]["error"].startswith("malformed tool call")


def test_unterminated_call_still_parses():
    _, calls, _ = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"q": "z"}}')
    assert calls == [{"name": "a", "arguments": {"q": "z"}}]


def test_plain_text_has_no_calls():
    assert parse_tool_calls("Paris.") == ("Paris.", [], [])


def test_a_call_missing_its_closing_tag_does_not_swallow_the_next():
    text = ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n'
            '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    content, calls, bad = parse_tool_calls(text)
    assert calls == [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}] and not bad


def test_tools_and_tool_choice():
    assert normalize_tools([WEATHER])[0]["function"]["name"] == "get_weather"
    with pytest.raises(DLMError, match="Malformed tool"):
        normalize_tools([{"type": "function", "function": {"description": "no name"}}])
    with pytest.raises(DLMError, match="type object"):
        normalize_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])
    tools = normalize_tools([WEATHER, TIME])
    assert tool_choice_name("auto", tools) is None and tool_choice_name("none", tools) == "none"
    assert tool_choice_name("any", tools) is True and tool_choice_name("any", tools[:1]) == "get_weather"
    assert tool_choice_name({"type": "function", "function": {"name": "get_time"}}, tools) == "get_time"
    with pytest.raises(DLMError, match="not among the tools"):
        tool_choice_name("nope", tools)
