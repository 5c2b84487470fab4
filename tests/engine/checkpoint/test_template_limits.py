"""Size bounds for what a chat template builds (engine/checkpoint/template_limits.py): strings joined, repeated
or summed, lists, numbers, splits and indents are checked before they are built. Each row was
measured before it was bounded (the cost it had is in its comment)."""

import time

import pytest
from tests.helpers import with_template

from dlm_backend.errors import TokenizerError

_BIG = "{% set s = 'x' * 3900000 %}"


@pytest.mark.parametrize("template,match", [
    ("{% set s = 'ab' %}" + "{% set s = s ~ s %}" * 33, "joined string of over 4000000"),         # 3.4 GB
    ("{{ ([1] * 100000)|join(' ' * 4000) }}", "joined string of over 4000000"),                  # 400 MB, OK
    ("{{ ([1] * 1000000)|join(' ' * 4000) }}", "repetition of 1 x 1000000"),                     # 4 GB, OK
    ("{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('x', 40) }}",
     "joined string"),                                                                           # 4.4 GB, 5.7 s
    ("{% set s = 'ab' %}" + "{% set s = s + s %}" * 33, "sum of 2097152"),
    (_BIG + "{{ [s] * 100000 }}", "text of a list"),                            # str() of the list: 390 GB
    ("{{ (' ' * 4000).join(['a'] * 100000) }}", "joined string"),
    ("{{ ('a ' * 2000000).split()|length }}", "split into over 100000"),
    ("{% set x = 7 %}" + "{% set x = x * x %}" * 40, "over 16384 bits"),
    ("{{ ('\n' * 3000000)|indent(4000) }}", "indent of 4000"),
])
def test_what_a_template_builds_is_bounded_before_it_is_built(tmp_path, dream_chat, template, match):
    tok = with_template(tmp_path, dream_chat, template)
    t = time.perf_counter()
    with pytest.raises(TokenizerError, match=match):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert time.perf_counter() - t < 4
