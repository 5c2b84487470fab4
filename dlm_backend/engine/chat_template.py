"""A checkpoint's chat template rendered in a Jinja sandbox that also bounds time and memory.

Jinja's sandbox stops attribute access to Python internals but not work: ``{{ 'a' * 10**10 }}``,
``{{ '%999999999999d' % 1 }}`` or ``tojson(indent=10**10)`` asked for 10 GB and more, and two nested
``range(100000)`` loops never finished. Here every operation that can grow a string or list checks
the size it would make first (:data:`MAX_CHARS`), loops and calls check a deadline
(:data:`MAX_SECONDS`), and any failure is a TokenizerError naming the template.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dlm_backend.errors import TokenizerError

MAX_CHARS = 4_000_000           # a rendered prompt, or any string/list made on the way (a 1 MiB body renders to ~1 MB)
MAX_SECONDS = 2.0               # rendering one conversation (real templates take well under 10 ms)
MAX_WIDTH = 4096                # a width or precision in a format spec
MAX_INDENT = 16
MAX_POWER = 1024
_PERCENT_SPEC = re.compile(r"%[#0\- +]*(\d*)(?:\.(\d*))?")      # '%8.3f': width and precision
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")                   # '{:>8}': the spec after the colon
_GROWING = ("ljust", "rjust", "center", "zfill", "expandtabs", "format", "format_map", "replace")


class _Budget:
    def __init__(self):
        self.deadline = time.monotonic() + MAX_SECONDS

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise TokenizerError(f"The chat template took over {MAX_SECONDS:g} s to render and was stopped. "
                                 "Use a checkpoint with a sane chat template.")


def _too_big(what: str) -> TokenizerError:
    return TokenizerError(f"The chat template tried to build {what} over the sandbox's limits "
                          f"({MAX_CHARS} characters, widths up to {MAX_WIDTH}) and was stopped.")


def _check_size(value):
    if isinstance(value, (str, list, tuple, bytes)) and len(value) > MAX_CHARS:
        raise _too_big(f"a value of {len(value)} items")
    return value


def _check_spec(fmt: str, values=()) -> None:
    """Refuse a format string whose widths or precisions exceed MAX_WIDTH, written in it or, for
    ``%*d`` and ``{:{w}}``, taken from the ``values`` it formats."""
    numbers = [n for m in _PERCENT_SPEC.finditer(fmt) for n in m.groups() if n]
    numbers += [n for spec in _BRACE_SPEC.findall(fmt) for n in re.findall(r"\d+", spec)]
    dynamic = "%*" in fmt or ".*" in fmt or re.search(r":[^{}]*\{", fmt) is not None
    if any(len(n) > 6 or int(n) > MAX_WIDTH for n in numbers) or (
            dynamic and any(isinstance(v, int) and abs(v) > MAX_WIDTH for v in values)):
        raise _too_big("a formatted field")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with size and time bounds; ``budget`` is reset for each render."""

    intercepted_binops = frozenset({"*", "%", "**"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        self.budget = _Budget()
        self.filters.update(tojson=self._tojson, format=self._format, center=self._center, indent=self._indent,
                            replace=self._replace)
        self.globals.update(range=self._range, raise_exception=_raise_exception,
                            strftime_now=lambda fmt: datetime.now().strftime(str(fmt)[:64]))

    def call_binop(self, context, operator, left, right):
        self.budget.check()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_CHARS:
                    raise _too_big(f"a repetition of {len(seq)} x {n}")
        elif operator == "%" and isinstance(left, str):
            _check_spec(left, right if isinstance(right, tuple) else (right,))
        elif operator == "**" and isinstance(right, (int, float)) and abs(right) > MAX_POWER:
            raise _too_big(f"a power of {right}")
        return _check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
        __self.budget.check()
        name = getattr(__obj, "__name__", "")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and name in _GROWING:
            _check_growth(owner, name, args, kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        # str.format / format_map are wrapped at attribute access, not routed through call().
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def bounded(*args, **kwargs):
            self.budget.check()
            values = [*args, *kwargs.values(), *(v for a in args if isinstance(a, dict) for v in a.values())]
            _check_spec(fmt, values)
            return _check_size(wrapped(*args, **kwargs))
        return bounded

    def _range(self, *args):
        rng = range(*args)
        if len(rng) > 100_000:
            raise _too_big(f"a range of {len(rng)}")
        for i in rng:                      # each step checks the deadline: nested loops end in time
            self.budget.check()
            yield i

    @staticmethod
    def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # HF's chat-template tojson: no HTML escaping, unicode kept (Jinja's built-in escapes '<', '>').
        if isinstance(indent, int) and indent > MAX_INDENT:
            raise _too_big(f"a JSON indent of {indent}")
        return _check_size(json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                      sort_keys=sort_keys))

    @staticmethod
    def _format(value, *args, **kwargs):
        value = str(value)
        _check_spec(value, [*args, *kwargs.values()])
        return _check_size(value % (kwargs or args))

    @staticmethod
    def _center(value, width=80):
        if width > MAX_WIDTH:
            raise _too_big(f"a width of {width}")
        return str(value).center(width)

    @staticmethod
    def _indent(value, width=4, first=False, blank=False):
        if isinstance(width, int) and width > MAX_WIDTH:
            raise _too_big(f"an indent of {width}")
        return jinja2.filters.do_indent(str(value), width, first, blank)

    @staticmethod
    def _replace(value, old, new, count=None):
        value, old, new = str(value), str(old), str(new)
        _check_growth(value, "replace", (old, new), {})
        return value.replace(old, new, -1 if count is None else count)

    def render(self, template: jinja2.Template, **values) -> str:
        """``template`` rendered with ``values``, bounded; any failure is a TokenizerError."""
        self.budget = _Budget()
        out, size = [], 0
        try:
            for piece in template.generate(**values):
                size += len(piece)
                if size > MAX_CHARS:
                    raise _too_big("a prompt")
                out.append(piece)
        except TokenizerError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TokenizerError(f"The chat template tried an unsafe operation and was stopped by the sandbox: "
                                 f"{exc}. Use a trusted checkpoint's template.") from None
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"The chat template failed to render: {exc}. Check the messages' roles and "
                                 "content, or fix the template.") from None
        except (Exception, RecursionError) as exc:  # noqa: BLE001 - OverflowError, TypeError, MemoryError, ...
            raise TokenizerError(f"The chat template failed to render ({type(exc).__name__}: {str(exc)[:200]}). "
                                 "Fix the template or the messages.") from None
        return "".join(out)


def _check_growth(s: str, name: str, args, kwargs) -> None:
    if name in ("ljust", "rjust", "center", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int) and width > MAX_CHARS:
            raise _too_big(f"a width of {width}")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int) and size * s.count("\t") > MAX_CHARS:
            raise _too_big("expanded tabs")
    elif name in ("format", "format_map"):
        _check_spec(s)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = s.count(args[0]) if args[0] else len(s) + 1
        if len(s) + hits * len(args[1]) > MAX_CHARS:
            raise _too_big("a replacement")


def _raise_exception(message):
    raise TokenizerError(f"The chat template rejected the conversation: {message}")
