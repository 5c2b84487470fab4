"""The tokenizer (engine/checkpoint/tokenizer.py): special tokens and chat templates read from the checkpoint's
files. The template sandbox: test_chat_template.py."""

import json

import pytest
from tests.helpers import with_template

from dlm_backend import LLM
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
from dlm_backend.errors import TokenizerError


def test_special_tokens_come_from_checkpoint_files(dream_chat, llada_chat):
    dream = LLM(str(dream_chat)).engine.tokens
    assert dream.mask_id == 300 and 301 in dream.eos_ids and dream.eot_ids == (303,)   # <|im_end|>
    llada = LLM(str(llada_chat)).engine.tokens
    assert llada.mask_id == 300 and 301 in llada.eos_ids and llada.eot_ids == (303,)   # <|eot_id|>


def test_chat_template_renders_roles_and_tools(dream_chat):
    tok = Tokenizer(dream_chat)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with_tools = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools)
    assert '"name": "get_weather"' in with_tools
    ids = tok.encode(text)
    assert ids[0] == 302 and tok.decode(ids, skip_special_tokens=False) == text


def test_llama3_template_uses_bos_from_config(llada_chat):
    text = Tokenizer(llada_chat).apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.startswith("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>")


def test_missing_template(tmp_path, dream_chat):
    with pytest.raises(TokenizerError, match="no chat template"):
        with_template(tmp_path, dream_chat).apply_chat_template([{"role": "user", "content": "x"}])


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path, dream_chat):
    named = [{"name": "default", "template": "plain:{{ messages[0]['content'] }}"},
             {"name": "tool_use", "template": "tools:{{ tools[0]['function']['name'] }}:{{ messages[0]['content'] }}"}]
    tok = with_template(tmp_path, dream_chat, named)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "plain:hi" and tok.renders_tools
    assert tok.apply_chat_template(msgs, tools=[{"function": {"name": "f"}}]) == "tools:f:hi"


def test_a_caller_value_overrides_a_special_token(tmp_path, dream_chat):
    """transformers lets template kwargs override special tokens; a duplicate keyword was a TypeError."""
    (tmp_path / "tokenizer.json").write_bytes((dream_chat / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ bos_token }}|{{ messages[0]['content'] }}", "bos_token": "<B>"}))
    tok = Tokenizer(tmp_path)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "<B>|hi" and tok.apply_chat_template(msgs, bos_token="") == "|hi"


def test_a_corrupt_tokenizer_file_is_a_tokenizer_error(tmp_path, dream_chat):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    with pytest.raises(TokenizerError, match="do not load.*Re-download"):
        Tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((dream_chat / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(TokenizerError, match="do not load"):
        Tokenizer(tmp_path)
