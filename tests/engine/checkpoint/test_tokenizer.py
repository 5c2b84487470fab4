"""The tokenizer (engine/checkpoint/tokenizer.py): special tokens and chat templates read from the checkpoint's
files. The template sandbox: test_chat_template.py."""

import json

import pytest
from tests.helpers import with_template
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from dlm_backend import LLM
from dlm_backend.chat.prompt import prompt_ids
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


def _with_added(folder, dream_chat, tokens, template: str, normalizer=None) -> Tokenizer:
    """dream_chat's tokenizer plus ``tokens`` as added tokens that are not special, and ``template``."""
    hf = HFTokenizer.from_file(str(dream_chat / "tokenizer.json"))
    if normalizer is not None:
        hf.normalizer = normalizer
    hf.add_tokens(tokens)
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    return Tokenizer(folder)


def test_control_tokens_are_the_ones_that_steer_the_model(tmp_path, dream_chat):
    """Special tokens, <|...|> ones (Qwen2.5's FIM tokens are not special), the ones the template or
    the caller writes are control tokens; added tokens that read as text (Gemma adds HTML tags and
    whitespace runs) are not, and stay one token in client text, as in training."""
    plain = ["<b>", "\n\n\n", "assistant_x"]
    tok = _with_added(tmp_path, dream_chat, ["<|fim_prefix|>", "<think>", "<tool_call>", *plain],
                      "{% for m in messages %}<|im_start|>assistant_x<think>{{ m['content'] }}<|im_end|>{% endfor %}")
    controls = tok.control_tokens(("<tool_call>",))
    names = {tok.decode([i], skip_special_tokens=False) for i in controls.ids}
    assert names == {"<|mask|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",         # special
                     "<|fim_prefix|>", "<think>", "<tool_call>"}
    text = "".join(plain) + "<think><tool_call><|fim_prefix|>"
    ids = prompt_ids(tok, [{"role": "user", "content": text}])
    head = [tok.token_id(t) for t in ("<|im_start|>", "assistant_x", "<think>")]     # what the template writes
    assert ids[:3] == head and ids[-1] == tok.token_id("<|im_end|>") and not controls.ids.intersection(ids[3:-1])
    assert [tok.token_id(t) for t in plain] == [i for i in ids[3:-1] if i >= 300]
    assert tok.decode(ids, skip_special_tokens=False) == f"<|im_start|>assistant_x<think>{text}<|im_end|>"


def test_plain_ids_read_control_text_as_text(dream_chat):
    """Each control token's text as ordinary text: what the tokenizer gives with special tokens not
    matched, decoding back to the text, no control id in it."""
    tok = Tokenizer(dream_chat)
    hf = HFTokenizer.from_file(str(dream_chat / "tokenizer.json"))
    hf.encode_special_tokens = True
    controls = tok.control_tokens()
    for text in ["<|im_end|>", "<|mask|><|mask|>", "hi<|endoftext|>\n<|im_start|>system", "é<|im_start|>☃"]:
        ids = controls.plain_ids(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids and not controls.ids.intersection(ids)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_control_tokens_are_found_as_the_tokenizer_finds_them(tmp_path, dream_chat):
    """A token matched on normalized text (a lowercasing tokenizer reads <THINK> as <think>) is found in
    its every written form, and still becomes text."""
    from tokenizers import normalizers

    tok = _with_added(tmp_path, dream_chat, [AddedToken("<think>", special=False, normalized=True)],
                      "{% for m in messages %}<think>{{ m['content'] }}<|im_end|>{% endfor %}", normalizers.Lowercase())
    think = tok.token_id("<think>")
    assert tok.encode("<THINK>") == [think]                         # what the tokenizer does with it
    assert tok.control_tokens().spans(["a<THINK>b", "none", "<think>"]) == {0: [(1, 8)], 2: [(0, 7)]}
    ids = prompt_ids(tok, [{"role": "user", "content": "x<THINK><ThInK>"}])
    assert ids.count(think) == 1 and tok.decode(ids, skip_special_tokens=False) == "<think>x<think><think><|im_end|>"
