"""A checkpoint's chat template rendered in a Jinja sandbox that also bounds time, memory and depth.

Jinja's sandbox stops attribute access to Python internals but not work. Here every operation that
can build a string or list checks the size it would make first (:mod:`template_limits`): the
operators (``+ * % **``), ``~`` and block bodies (through :class:`_BoundedCodeGenerator`, which
routes them into a bounded join), every ``{{ output }}``, the filters (an allowlist of what real
templates use, each wrapped; ``wordwrap``, ``lipsum``, ``batch``, ``sum``... are gone) and the str
methods. Loops, calls, filters and outputs check a deadline (:data:`MAX_SECONDS`), macro and
recursive-loop calls nest at most MAX_DEPTH deep, and any failure is a TokenizerError.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from datetime import datetime

import jinja2
import markupsafe
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dlm_backend.engine.checkpoint.template_limits import (BOUNDED_FILTERS, BUILTIN_TYPES, FILTERS, MAX_CHARS,
                                                           MAX_DEPTH, MAX_ITEMS, MAX_SHORT, as_text, bounded_join,
                                                           bounded_str_method, check_binop, check_format, check_size,
                                                           method_allowed, take, text_size, too_big)
from dlm_backend.errors import TokenizerError

MAX_SECONDS = 2.0               # rendering one conversation (real templates take well under 10 ms)
MAX_TEMPLATE_CHARS = 64 * 1024  # the largest real ones (Gemma 4, gpt-oss, Cohere) are 11-19 KB; 256 KB compiled in 6 s
#: Characters (and list items) built in all during one render. Each operation is bounded by
#: MAX_CHARS, but 2 s of 4 MB copies kept in a list reached gigabytes; real templates build a few
#: times their prompt (Qwen3 ~8 copies of each message on the way), under 16 x MAX_CHARS.
MAX_BUILT = 16 * MAX_CHARS
class _State(threading.local):
    """One render's deadline, call depth and characters built (a Tokenizer may render on several
    threads at once)."""
    deadline = math.inf         # no render running: compile-time constant folding is bounded by size only
    depth = 0
    built = 0


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~``, outputs and loops routed through the environment's bounds
    (block bodies already join through ``environment.concat``)."""

    def visit_Template(self, node, frame=None):
        # Every loop's iterable becomes environment.iterate(iterable) (jinja allows no new node types).
        for loop in list(node.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("iterate"), [loop.iter], [], None, None,
                                   lineno=loop.iter.lineno)
        super().visit_Template(node, frame)

    def visit_Getitem(self, node, frame):
        # Jinja slices in plain Python (s[1:] copies 4 MB unseen); here they go through slice_of.
        if not isinstance(node.arg, nodes.Slice):
            return super().visit_Getitem(node, frame)
        self.write("environment.slice_of(")
        self.visit(node.node, frame)
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            self.write(", ")
            self.visit(part, frame) if part is not None else self.write("None")
        self.write(")")

    # The flags below are jinja's own choices, as Python source: markup_join inside {% autoescape %}
    # blocks (volatile) or with autoescape on, escaped output where autoescape is on.
    def visit_Concat(self, node, frame):
        self.write("environment.join_parts((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        markup = "context.eval_ctx.volatile" if frame.eval_ctx.volatile else repr(bool(frame.eval_ctx.autoescape))
        self.write(f"), {markup})")

    def _output_child_pre(self, node, frame, finalize):
        self.write("environment.output(")

    def _output_child_post(self, node, frame, finalize):
        escape = "context.eval_ctx.autoescape" if frame.eval_ctx.volatile else repr(bool(frame.eval_ctx.autoescape))
        self.write(f", {escape})")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with size, time and depth bounds."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        self._state = _State()
        base = {**self.filters, **BOUNDED_FILTERS}
        self.filters = {name: self._guard(base[name], kind) for name, kind in FILTERS.items()}
        self.tests = {name: self._guard(test, "") for name, test in self.tests.items()}
        self.globals = {"range": self._range, "namespace": self.globals["namespace"], "dict": dict,
                        "cycler": self.globals["cycler"], "joiner": self.globals["joiner"],
                        "raise_exception": _raise_exception, "lipsum": _no_lipsum,
                        "strftime_now": lambda fmt: datetime.now().strftime(str(fmt)[:64])}

    def tick(self) -> None:
        if time.monotonic() > self._state.deadline:
            raise TokenizerError(f"The chat template took over {MAX_SECONDS:g} s to render and was stopped. "
                                 "Use a checkpoint with a sane chat template.")

    def _spend(self, result, *inputs):
        """``result`` size-checked, and counted against MAX_BUILT unless it is one of ``inputs``."""
        check_size(result)
        if isinstance(result, (str, list, tuple)) and not any(result is x for x in inputs):
            state = self._state
            state.built += len(result)
            if state.built > MAX_BUILT:
                raise too_big(f"over {MAX_BUILT} characters in all while rendering")
        return result

    # --- what the compiled template calls -------------------------------------------------------
    def output(self, value, escape: bool = False) -> str:
        """``{{ value }}`` as text, bounded (``str`` of ``[s] * 10**5`` was 10**5 copies of ``s``)."""
        self.tick()
        if escape:
            text_size(value)
            return self._spend(markupsafe.escape(value), value)
        return value if type(value) is str else self._spend(as_text(value))

    def join_parts(self, parts, markup: bool = False) -> str:
        """``a ~ b ~ c``: 33 x ``{% set s = s ~ s %}`` reached 3.4 GB before a MemoryError."""
        self.tick()
        text = self._spend(bounded_join(parts), *parts)
        return self._spend(jinja2.runtime.markup_join(parts)) if markup else text

    def concat(self, pieces) -> str:
        """The body of a ``{% set %}`` block, macro, ``{% filter %}`` or call block (jinja's ``"".join``)."""
        return self._spend(bounded_join(pieces, strict=True))

    def iterate(self, iterable):
        """A loop's items: the deadline checked every 64, and at most MAX_ITEMS of them."""
        for i, item in enumerate(iterable):
            if not i & 63:
                self.tick()
                if i >= MAX_ITEMS:
                    raise too_big(f"a loop of over {MAX_ITEMS} steps")
            yield item

    def call_binop(self, context, operator, left, right):
        self.tick()
        check_binop(operator, left, right)
        return self._spend(super().call_binop(context, operator, left, right), left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
        __self.tick()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (dict, list, tuple)):      # lookups (get, count, index...): nothing is built
            return check_size(super().call(__context, __obj, *args, **kwargs))
        if not isinstance(__obj, (Macro, LoopContext)):
            return __self._spend(super().call(__context, __obj, *args, **kwargs), owner, *args)
        state = __self._state
        if state.depth >= MAX_DEPTH:    # a macro doubling a string on each recursion made 4.4 GB
            raise TokenizerError(f"The chat template nests macro or loop calls over {MAX_DEPTH} deep and was "
                                 "stopped. Fix the template's recursion.")
        state.depth += 1
        try:
            return __self._spend(super().call(__context, __obj, *args, **kwargs))
        finally:
            state.depth -= 1

    def is_safe_attribute(self, obj, attr, value):
        if isinstance(obj, BUILTIN_TYPES) and callable(value) and not method_allowed(obj, attr):
            return False
        return super().is_safe_attribute(obj, attr, value)

    def wrap_str_format(self, value):
        # Jinja's hook on every attribute access: str.format goes through its sandboxed formatter,
        # and the str methods that can grow a string or make many pieces get size checks.
        owner = getattr(value, "__self__", None)
        if not isinstance(owner, str) or not callable(value):
            return None
        name = getattr(value, "__name__", "")
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return bounded_str_method(value) if method_allowed(owner, name) else None

        def bounded(*args, **kwargs):
            self.tick()
            mapping = args[0] if name == "format_map" and args and isinstance(args[0], dict) else {}
            check_format(owner, (*args, *kwargs.values(), *mapping.values()))
            return wrapped(*args, **kwargs)             # counted by call()
        return bounded

    def _guard(self, fn, kind: str):
        """``fn`` (a filter or test) checking the deadline, its input (``kind``) and its result's size."""
        at = 0 if getattr(fn, "jinja_pass_arg", None) is None else 1      # the value follows a context arg

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            self.tick()
            if kind and len(args) > at:
                value = args[at]
                if kind in ("text", "short") and text_size(value) > (MAX_SHORT if kind == "short" else MAX_CHARS):
                    raise too_big(f"input of {text_size(value)} characters to a filter that takes at most {MAX_SHORT}")
                elif kind in ("list", "seq") and not isinstance(value, str):
                    args = (*args[:at], take(value), *args[at + 1:])
                elif kind == "list" and len(value) > MAX_ITEMS:      # 'x'|list: one item per character
                    raise too_big(f"a list of {len(value)} characters")
            return self._spend(fn(*args, **kwargs), *args)
        return guarded

    def slice_of(self, obj, start, stop, step):
        """``obj[start:stop:step]``: a copy, counted (s[i:] kept in a list built 4 MB per step)."""
        self.tick()
        return self._spend(obj[start:stop:step], obj)

    def _range(self, *args):
        rng = range(*args)
        if len(rng) > MAX_ITEMS:
            raise too_big(f"a range of {len(rng)}")
        return rng

    # --- entry points ---------------------------------------------------------------------------
    def compile_template(self, source: str) -> jinja2.Template:
        """``source`` compiled; too long or invalid is a TokenizerError."""
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TokenizerError(f"The chat template is {len(source)} characters, over the sandbox's "
                                 f"{MAX_TEMPLATE_CHARS}. Use a checkpoint with a sane chat template.")
        try:
            return self.from_string(source)
        except TokenizerError:          # a bound hit while folding constants
            raise
        # TemplateError, RecursionError, and Python's own SyntaxError ("too many statically nested blocks")
        except (Exception, RecursionError) as exc:  # noqa: BLE001
            hint = (f" This sandbox offers the filters real chat templates use: {', '.join(sorted(FILTERS))}."
                    if "No filter named" in str(exc) else "")
            raise TokenizerError(f"The chat template does not compile: {str(exc)[:200].rstrip('.')}.{hint} "
                                 "Fix the template.") from None

    def render(self, template: jinja2.Template, **values) -> str:
        """``template`` rendered with ``values``, bounded; any failure is a TokenizerError."""
        state = self._state
        state.deadline, state.depth, state.built = time.monotonic() + MAX_SECONDS, 0, 0
        out, size = [], 0
        try:
            for piece in template.generate(**values):
                size += len(piece)
                if size > MAX_CHARS:
                    raise too_big("a prompt")
                out.append(piece)
        except TokenizerError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TokenizerError(f"The chat template tried an unsafe operation and was stopped by the sandbox: "
                                 f"{exc}. Use a trusted checkpoint's template.") from None
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"The chat template failed to render: {str(exc)[:300]}. Check the messages' "
                                 "roles and content, or fix the template.") from None
        except (Exception, RecursionError) as exc:  # noqa: BLE001 - OverflowError, TypeError, MemoryError, ...
            raise TokenizerError(f"The chat template failed to render ({type(exc).__name__}: {str(exc)[:200]}). "
                                 "Fix the template or the messages.") from None
        finally:
            state.deadline = math.inf
        return "".join(out)


def _raise_exception(message):
    raise TokenizerError(f"The chat template rejected the conversation: {str(message)[:500]}")


def _no_lipsum(*args, **kwargs):
    raise TokenizerError("The chat template calls lipsum(), which this sandbox does not offer (lipsum(n=200000) "
                         "took 11 s). Remove it from the template.")
