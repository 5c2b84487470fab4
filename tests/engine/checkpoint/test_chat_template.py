"""A checkpoint's chat template (engine/checkpoint/chat_template.py) runs in a Jinja sandbox: no Python
internals, clear errors, and bounded work, depth and compiled size. Each row below was measured on
the sandbox before it was bounded (the cost it had is in its comment); the sizes of what a template
builds are template_limits.py's (test_template_limits.py)."""

import time

import pytest
from tests.helpers import with_template

from dlm_backend.errors import TokenizerError

_BIG = "{% set s = 'x' * 3900000 %}"
_KEEP = "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [ITEM] %}{% endfor %}"


def test_template_is_sandboxed(tmp_path, dream_chat):
    tok = with_template(tmp_path, dream_chat, "{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TokenizerError, match="unsafe"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_template_raise_exception_is_a_clear_error(tmp_path, dream_chat):
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    with pytest.raises(TokenizerError, match="first must be user"):
        with_template(tmp_path, dream_chat, template).apply_chat_template([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize("template,match", [
    ("{% set s = 'x' * 2000000 %}{{ s|wordwrap(1)|wordwrap(1)|wordwrap(1) }}", "No filter named 'wordwrap'"),  # 58 s
    ("{{ lipsum(n=200000) }}", "lipsum"),                                                        # 11 s
    (_BIG + _KEEP.replace("ITEM", "s ~ i"), "characters in all"),                              # 4 MB kept per step
    (_BIG + _KEEP.replace("ITEM", "s[i:]"), "characters in all"),                              # slices copied unseen
    ("{% set l = [1] * 100000 %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}", "took over 2 s"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests macro or loop calls over 64"),
    ("{{ (1).to_bytes(10**9, 'big') }}", "unsafe.*to_bytes"),                   # 1 GB before its size was seen
    ("{{ ('ab ' * 1300000)|title }}", "at most 65536"),                          # 2.5 s in one call
    ("{{ ('a' * 4000000).translate({97: 'x' * 4000000}) }}", "unsafe.*translate"),
    ("{{ 'x' }}" * 8000, "over the sandbox's 65536"),                           # 256 KB compiled in 6 s
    ("{% for a in b %}" * 30 + "{% endfor %}" * 30, "does not compile.*nested blocks"),  # a raw SyntaxError
])
def test_template_work_depth_and_size_are_bounded(tmp_path, dream_chat, template, match):
    tok = with_template(tmp_path, dream_chat, template)
    t = time.perf_counter()
    with pytest.raises(TokenizerError, match=match):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert time.perf_counter() - t < 4
