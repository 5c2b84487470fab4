"""Tokenizer, chat template (sandboxed) and the special tokens taken from the checkpoint."""

import json
import time

import pytest

from dlm_backend import LLM
from dlm_backend.engine.tokenizer import Tokenizer
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


def _with_template(folder, dream_chat, template=None):
    """A checkpoint folder with dream_chat's tokenizer and the given chat template (or none)."""
    (folder / "tokenizer.json").write_bytes((dream_chat / "tokenizer.json").read_bytes())
    if template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return Tokenizer(folder)


def test_template_is_sandboxed(tmp_path, dream_chat):
    tok = _with_template(tmp_path, dream_chat, "{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TokenizerError, match="unsafe"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_template_raise_exception_is_a_clear_error(tmp_path, dream_chat):
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    with pytest.raises(TokenizerError, match="first must be user"):
        _with_template(tmp_path, dream_chat, template).apply_chat_template([{"role": "assistant", "content": "x"}])


def test_missing_template(tmp_path, dream_chat):
    with pytest.raises(TokenizerError, match="no chat template"):
        _with_template(tmp_path, dream_chat).apply_chat_template([{"role": "user", "content": "x"}])


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path, dream_chat):
    named = [{"name": "default", "template": "plain:{{ messages[0]['content'] }}"},
             {"name": "tool_use", "template": "tools:{{ tools[0]['function']['name'] }}:{{ messages[0]['content'] }}"}]
    tok = _with_template(tmp_path, dream_chat, named)
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


_BIG = "{% set s = 'x' * 3900000 %}"
_KEEP = "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [ITEM] %}{% endfor %}"


@pytest.mark.parametrize("template,match", [
    # The audit's rows, each measured on the sandbox before ~, filters and calls were bounded:
    ("{% set s = 'ab' %}" + "{% set s = s ~ s %}" * 33, "joined string of over 4000000"),         # 3.4 GB
    ("{{ ([1] * 100000)|join(' ' * 4000) }}", "joined string of over 4000000"),                  # 400 MB, OK
    ("{{ ([1] * 1000000)|join(' ' * 4000) }}", "repetition of 1 x 1000000"),                     # 4 GB, OK
    ("{% set s = 'x' * 2000000 %}{{ s|wordwrap(1)|wordwrap(1)|wordwrap(1) }}", "No filter named 'wordwrap'"),  # 58 s
    ("{{ lipsum(n=200000) }}", "lipsum"),                                                        # 11 s
    ("{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('x', 40) }}",
     "joined string"),                                                                           # 4.4 GB, 5.7 s
    # ... and their kin:
    ("{% set s = 'ab' %}" + "{% set s = s + s %}" * 33, "sum of 2097152"),
    (_BIG + "{{ [s] * 100000 }}", "text of a list"),                            # str() of the list: 390 GB
    (_BIG + _KEEP.replace("ITEM", "s ~ i"), "characters in all"),                              # 4 MB kept per step
    (_BIG + _KEEP.replace("ITEM", "s[i:]"), "characters in all"),                              # slices copied unseen
    ("{% set l = [1] * 100000 %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}", "took over 2 s"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests macro or loop calls over 64"),
    ("{{ (1).to_bytes(10**9, 'big') }}", "unsafe.*to_bytes"),                   # 1 GB before its size was seen
    ("{{ ('a' * 4000000).translate({97: 'x' * 4000000}) }}", "unsafe.*translate"),
    ("{{ (' ' * 4000).join(['a'] * 100000) }}", "joined string"),
    ("{{ ('a ' * 2000000).split()|length }}", "split into over 100000"),
    ("{% set x = 7 %}" + "{% set x = x * x %}" * 40, "over 16384 bits"),
    ("{{ ('\n' * 3000000)|indent(4000) }}", "indent of 4000"),
    ("{{ ('ab ' * 1300000)|title }}", "at most 65536"),                          # 2.5 s in one call
    ("{{ 'x' }}" * 8000, "over the sandbox's 65536"),                           # 256 KB compiled in 6 s
    ("{% for a in b %}" * 30 + "{% endfor %}" * 30, "does not compile.*nested blocks"),  # a raw SyntaxError
])
def test_template_work_and_memory_are_bounded(tmp_path, dream_chat, template, match):
    tok = _with_template(tmp_path, dream_chat, template)
    t = time.perf_counter()
    with pytest.raises(TokenizerError, match=match):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert time.perf_counter() - t < 4
