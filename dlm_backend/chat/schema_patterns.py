"""Patterns of client schemas, on the ``regex`` engine in bounded time and memory.

``regex`` takes a ``timeout`` and releases the GIL while it matches. A linear-time engine (RE2)
would need no timeout, but it refuses lookarounds and backreferences, which JSON Schema's regex
dialect (ECMA-262) allows and clients use; so backtracking is bounded by time instead: each search
gets at most :data:`PATTERN_SECONDS`, and all searches of one validation share its deadline
(:data:`DEADLINE`, set by ``schema.validates``). ``regex`` also unrolls a counted repeat's minimum
when it compiles (``a{100000}``: 26 MB; ``a{4294967294}`` ran for minutes), so
:func:`unrolled_size` bounds that before anything is compiled. jsonschema's own pattern keywords
use Python's ``re`` (no timeout, the GIL held): the keywords here replace them.
"""

from __future__ import annotations

import contextvars
import functools
import time

import jsonschema
import regex

MAX_UNROLLED = 4096             # one pattern's counted repeats, multiplied through nesting (~1 MB compiled)
MAX_UNROLLED_TOTAL = 16_384     # all of one request's patterns
PATTERN_SECONDS = 0.05          # one pattern against one value

#: When the current validation must end (monotonic seconds); none outside a validation.
DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("schema_deadline", default=float("inf"))


class OutOfTime(Exception):
    """The shared deadline of one validation passed."""


_ESCAPE_WITH_BRACES = frozenset("pPNxuU")   # \p{L}, \x{41}: braces that are no repeat
_REPEAT = regex.compile(r"\{(\d*)(?:,(\d*))?\}")


def unrolled_size(pattern: str) -> int:
    """An upper bound on the characters ``regex`` unrolls a pattern into: each atom counts 1, a
    counted repeat multiplies what it repeats by its minimum (``(ab){3}`` is 6, ``a{0,9999}`` 1).
    It stops counting once past :data:`MAX_UNROLLED_TOTAL`."""
    stack, last, i, n = [0], 0, 0, len(pattern)
    while i < n and stack[0] <= MAX_UNROLLED_TOTAL:
        c = pattern[i]
        if c == "\\":
            i += 2
            if pattern[i - 1:i] in _ESCAPE_WITH_BRACES and pattern[i:i + 1] == "{":
                i = pattern.find("}", i) + 1 or n
            stack[-1], last = stack[-1] + 1, 1
            continue
        if c == "[":
            i = _class_end(pattern, i)
            stack[-1], last = stack[-1] + 1, 1
            continue
        repeat = _REPEAT.match(pattern, i) if c == "{" else None
        if c == "(":
            stack.append(0)
        elif c == ")" and len(stack) > 1:
            last = stack.pop()
            stack[-1] += last
            if stack[-1] > MAX_UNROLLED_TOTAL:
                return MAX_UNROLLED_TOTAL + 1
        elif repeat and (repeat.group(1) or repeat.group(2)):
            low = repeat.group(1) or "0"
            if len(low) > 9:                                  # beyond any limit (and int()'s digit cap)
                return MAX_UNROLLED_TOTAL + 1
            stack[-1] += last * (max(int(low), 1) - 1)
            last *= max(int(low), 1)
            if stack[-1] > MAX_UNROLLED_TOTAL:      # sizes only grow: stop before the numbers do
                return MAX_UNROLLED_TOTAL + 1
            i = repeat.end()
            continue
        elif c not in "*+?|^$":
            stack[-1], last = stack[-1] + 1, 1
        i += 1
    return max(stack[0], sum(stack))


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at ``i`` (``[]a]`` and ``[^]a]`` hold a ``]``)."""
    j = i + 1
    if pattern[j:j + 1] == "^":
        j += 1
    if pattern[j:j + 1] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


@functools.lru_cache(maxsize=64)        # compiled patterns are <= ~1 MB each (MAX_UNROLLED); not regex's 500
def compiled(regex_text: str):
    return regex.compile(regex_text, cache_pattern=False)


def search(regex_text: str, value: str) -> bool:
    """Whether ``regex_text`` matches in ``value``; one that runs out of its time counts as not
    matching, and a validation past its deadline stops here (OutOfTime)."""
    left = DEADLINE.get() - time.monotonic()
    if left <= 0:
        raise OutOfTime
    try:
        return compiled(regex_text).search(value, timeout=min(PATTERN_SECONDS, left)) is not None
    except (TimeoutError, regex.error):
        return False


def pattern_keyword(validator, regex_text, instance, schema):
    if validator.is_type(instance, "string") and not search(regex_text, instance):
        yield jsonschema.ValidationError(f"{instance!r:.80} does not match {regex_text!r:.80}")


def pattern_properties_keyword(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def additional_properties_keyword(validator, extra_schema, instance, schema):
    """jsonschema's ``additionalProperties`` with ``patternProperties`` matched by :func:`search`
    (its own runs them joined on Python's ``re``: no timeout, and the GIL held throughout)."""
    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in named and not any(search(p, k) for p in patterns)]
    if validator.is_type(extra_schema, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], extra_schema, path=extra)
    elif extra_schema is False and extras:
        yield jsonschema.ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras)):.200} "
                                         "unexpected)")
