"""Size bounds for everything a chat template can build: strings, lists, numbers, JSON, formats.

Each helper checks the size an operation *would* produce before doing it (or streams it and stops
at the limit), so a hostile template fails with a TokenizerError naming the limit instead of
allocating gigabytes. :mod:`dlm_backend.engine.checkpoint.chat_template` routes the sandbox's operators,
filters, methods and output through these.
"""

from __future__ import annotations

import io
import itertools
import json
import re

import jinja2
from jinja2.filters import do_indent
from jinja2.runtime import Namespace
from jinja2.utils import pass_environment

from dlm_backend.errors import TokenizerError

MAX_CHARS = 4_000_000           # a rendered prompt, or any string made on the way (a 1 MiB body renders to ~1 MB)
MAX_ITEMS = 100_000             # a list, range or loop (real conversations hold < 1,000 messages and tools)
MAX_WIDTH = 4096                # a width or precision in a format spec, a padding or indent width
MAX_INDENT = 16                 # tojson(indent=...): real templates use 2 or 4
MAX_DEPTH = 64                  # nesting of a value turned into text, and of macro / recursive-loop calls
MAX_INT_BITS = 16_384           # ~4,900 digits: Python refuses str() of ints over 4,300 digits anyway
MAX_SHORT = 65_536              # input of the filters written in Python per word: title on 4M characters took 2.5 s
#: Filters real chat templates use (Llama 3.x, Qwen2.5/3, Mistral, Gemma, DeepSeek, Phi, Cohere,
#: Kimi, GLM, gpt-oss, ChatML...) and their harmless kin. Value: whether it turns its input into
#: text (measured first; "short": at most MAX_SHORT characters) or a list (at most MAX_ITEMS taken;
#: "seq": a string passes as it is).
FILTERS = {"abs": "", "attr": "", "capitalize": "text", "center": "text", "count": "", "d": "", "default": "",
           "dictsort": "", "e": "text", "escape": "text", "first": "", "float": "", "format": "text",
           "indent": "text", "int": "", "items": "", "join": "", "last": "", "length": "", "list": "list",
           "lower": "text", "map": "", "max": "list", "min": "list", "reject": "", "rejectattr": "",
           "replace": "text", "reverse": "seq", "round": "", "safe": "text", "select": "", "selectattr": "",
           "sort": "list", "string": "text", "title": "short", "tojson": "", "trim": "text", "truncate": "text",
           "unique": "list", "upper": "text"}
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d*|\*)(?:\.(\d*|\*))?")   # '%8.3f', '%(x)5s'
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")                                 # '{:>8}': the spec
_SCALAR_CHARS = 32              # text of a number, None or a runtime object (macro, loop): short reprs


def too_big(what: str) -> TokenizerError:
    return TokenizerError(f"The chat template asked for {what}, over the sandbox's limits ({MAX_CHARS} "
                          f"characters, {MAX_ITEMS} items, widths up to {MAX_WIDTH}, nesting {MAX_DEPTH}) and "
                          "was stopped. Fix the template or use a checkpoint with a sane one.")


def check_size(value):
    """``value`` itself, refused when it is a string over MAX_CHARS or a list over MAX_ITEMS."""
    if isinstance(value, str) and len(value) > MAX_CHARS:
        raise too_big(f"a string of {len(value)} characters")
    if isinstance(value, (list, tuple, dict)) and len(value) > MAX_ITEMS:
        raise too_big(f"a collection of {len(value)} items")
    return value


def text_size(value) -> int:
    """An estimate of ``len(str(value))`` made without building it, refused over MAX_CHARS or when
    nested over MAX_DEPTH (which also ends a namespace holding itself). It stops as soon as the
    limit is passed, so ``[[s] * 10**5] * 10**5`` costs one inner list, not 10**10 items. Quotes
    and separators count; escapes in a repr (at most 10 characters for one) do not."""
    if isinstance(value, str):
        return len(value)
    total = 0

    def walk(v, depth: int) -> None:
        nonlocal total
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, (list, tuple, set, frozenset, dict, Namespace)):
            if depth >= MAX_DEPTH:
                raise too_big(f"a value nested over {MAX_DEPTH} deep")
            items = object.__getattribute__(v, "_Namespace__attrs") if isinstance(v, Namespace) else v
            for item in (itertools.chain.from_iterable(items.items()) if isinstance(items, dict) else items):
                total += 2
                walk(item, depth + 1)
                if total > MAX_CHARS:
                    raise too_big(f"the text of a {type(value).__name__} of over {MAX_CHARS} characters")
        elif isinstance(v, bytes):
            total += 4 * len(v) + 3
        else:
            total += _SCALAR_CHARS
    walk(value, 0)
    if total > MAX_CHARS:
        raise too_big(f"the text of a value of {total} characters")
    return total


def as_text(value) -> str:
    """``str(value)``, bounded."""
    text_size(value)
    return check_size(str(value))


def take(iterable) -> list:
    """The items of ``iterable`` as a list; more than MAX_ITEMS is refused after MAX_ITEMS + 1."""
    items = list(itertools.islice(iter(iterable), MAX_ITEMS + 1))
    if len(items) > MAX_ITEMS:
        raise too_big(f"a sequence of over {MAX_ITEMS} items")
    return items


def bounded_join(items, sep: str = "", strict: bool = False) -> str:
    """``sep.join(str(item) for item in items)``, refused as soon as it passes MAX_CHARS (``[1] * 10**6``
    joined by 4,000 spaces was 4 GB). ``strict``: items must already be strings, as for ``str.join``."""
    out, size = io.StringIO(), 0
    for i, item in enumerate(items):
        if not isinstance(item, str):
            if strict:
                raise TypeError(f"sequence item {i}: expected str instance, {type(item).__name__} found")
            item = as_text(item)
        size += len(item) + (len(sep) if i else 0)
        if size > MAX_CHARS:
            raise too_big(f"a joined string of over {MAX_CHARS} characters")
        if i:
            out.write(sep)
        out.write(item)
    return out.getvalue()


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """HF's chat-template ``tojson`` (no HTML escaping, unicode kept), streamed so that output over
    MAX_CHARS stops it part way; the same text as ``json.dumps``."""
    if (isinstance(indent, int) and indent > MAX_INDENT) or (isinstance(indent, str) and len(indent) > MAX_INDENT):
        raise too_big(f"a JSON indent of {indent!r:.20}")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    out, size = [], 0
    for chunk in encoder.iterencode(value):
        size += len(chunk)
        if size > MAX_CHARS:
            raise too_big(f"JSON of over {MAX_CHARS} characters")
        out.append(chunk)
    return "".join(out)


def check_format(fmt: str, values=()) -> None:
    """Refuse ``fmt % values`` / ``fmt.format(*values)`` when a width or precision exceeds MAX_WIDTH
    (written in it or, for ``%*d`` and ``{:{w}}``, taken from ``values``) or the result could pass
    MAX_CHARS: the format, every width and the text of every value, added up."""
    numbers = [n for m in _PERCENT_SPEC.finditer(fmt) for n in m.groups() if n and n != "*"]
    numbers += [n for spec in _BRACE_SPEC.findall(fmt) for n in re.findall(r"\d+", spec)]
    dynamic = "*" in fmt or re.search(r":[^{}]*\{", fmt) is not None
    widths = [int(n) if len(n) <= 6 else MAX_WIDTH + 1 for n in numbers]
    if dynamic:
        widths += [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if any(w > MAX_WIDTH for w in widths):
        raise too_big(f"a formatted field wider than {MAX_WIDTH}")
    if len(fmt) + sum(widths) + sum(text_size(v) for v in values) > MAX_CHARS:
        raise too_big(f"a formatted string of over {MAX_CHARS} characters")


def format_values(right) -> tuple:
    """The values ``fmt % right`` formats: a tuple's items, a mapping's values, else ``right``."""
    if isinstance(right, tuple):
        return right
    if isinstance(right, dict):
        return tuple(right.values())
    return (right,)


def check_binop(operator: str, left, right) -> None:
    """Refuse an operator whose result would pass the limits (``s ~ s`` is in :func:`bounded_join`)."""
    if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        limit = MAX_CHARS if isinstance(left, str) else MAX_ITEMS
        if len(left) + len(right) > limit:
            raise too_big(f"a sum of {len(left)} + {len(right)} items")
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                limit = MAX_CHARS if isinstance(seq, str) else MAX_ITEMS
                if len(seq) * max(n, 0) > limit:
                    raise too_big(f"a repetition of {len(seq)} x {n}")
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise too_big(f"a number of over {MAX_INT_BITS} bits")
    elif operator == "%" and isinstance(left, str):
        check_format(left, format_values(right))
    elif operator == "**" and _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0 and (
            right > MAX_INT_BITS or left.bit_length() * right > MAX_INT_BITS):
        raise too_big(f"a power of {right} (over {MAX_INT_BITS} bits)")
    elif operator == "**" and isinstance(right, (int, float)) and abs(right) > MAX_INT_BITS:
        raise too_big(f"a power of {right}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: The methods a template may call on builtin values: what real chat templates call (``strip``,
#: ``split``, ``startswith``, ``items``, ``get``...) and their harmless kin. Others (``str.encode``,
#: ``str.translate``, ``int.to_bytes(10**9)``...) are unsafe attributes, as ``__class__`` is.
METHODS = {
    str: frozenset("""capitalize casefold center count endswith find format format_map index isalnum isalpha
        isdecimal isdigit islower isnumeric isspace istitle isupper join ljust lower lstrip partition removeprefix
        removesuffix replace rfind rindex rjust rpartition rsplit rstrip split startswith strip swapcase title
        upper zfill""".split()),
    dict: frozenset({"get", "items", "keys", "values"}),
    list: frozenset({"count", "index"}),
    tuple: frozenset({"count", "index"}),
}
BUILTIN_TYPES = (str, bytes, int, float, complex, list, tuple, dict, set, frozenset, range)


def method_allowed(obj, attr: str) -> bool:
    return any(isinstance(obj, kind) and attr in names for kind, names in METHODS.items())


def bounded_str_method(method):
    """A size-checked stand-in for the str ``method`` that can grow a string past its input (join,
    padding, replace) or make many pieces (split); None for the others."""
    s, name = method.__self__, method.__name__
    if name == "join":
        def join(iterable):
            items = take(iterable)
            text = bounded_join(items, s, strict=True)
            return method(items) if type(s) is not str else text      # Markup.join escapes its items
        return join
    if name in ("center", "ljust", "rjust", "zfill"):
        def pad(width, *args):
            if isinstance(width, int) and width > MAX_WIDTH:
                raise too_big(f"a width of {width}")
            return method(width, *args)
        return pad
    if name == "replace":
        def replace(old, new, count=-1):
            if isinstance(old, str) and isinstance(new, str):
                hits = s.count(old) if old else len(s) + 1
                if count is not None and count >= 0:
                    hits = min(hits, count)
                if len(s) + hits * len(new) > MAX_CHARS:
                    raise too_big(f"a replacement of {hits} x {len(new)} characters")
            return method(old, new, count)
        return replace
    if name in ("split", "rsplit"):
        def split(sep=None, maxsplit=-1):
            # Asking for at most MAX_ITEMS splits bounds the pieces made before the count is known.
            cap = MAX_ITEMS if not isinstance(maxsplit, int) or not 0 <= maxsplit <= MAX_ITEMS else maxsplit
            parts = method(sep, cap)
            if len(parts) > MAX_ITEMS:
                raise too_big(f"a split into over {MAX_ITEMS} pieces")
            return parts
        return split
    return None


@pass_environment
def _join(environment, value, d="", attribute=None):
    if attribute is not None:
        value = map(jinja2.filters.make_attrgetter(environment, attribute), value)
    return bounded_join(value, as_text(d))


def _format(value, *args, **kwargs):
    if args and kwargs:
        raise jinja2.exceptions.FilterArgumentError("can't handle positional and keyword arguments at the same time")
    value = as_text(value)
    check_format(value, (*args, *kwargs.values()))
    return value % (kwargs or args)


def _center(value, width=80):
    if isinstance(width, int) and width > MAX_WIDTH:
        raise too_big(f"a width of {width}")
    return as_text(value).center(width)


def _indent(value, width=4, first=False, blank=False):
    # Each line gets the indent: 4M newlines x a 4,096 indent would be 16 GB (and jinja indents
    # line by line in Python, so lines are MAX_ITEMS at most).
    value = as_text(value)
    w, lines = len(width) if isinstance(width, str) else width, value.count("\n") + 1
    if isinstance(w, int) and (w > MAX_WIDTH or lines > MAX_ITEMS or len(value) + lines * w > MAX_CHARS):
        raise too_big(f"an indent of {w} on {lines} lines")
    return do_indent(value, width, first, blank)


def _replace(value, old, new, count=None):
    replace = bounded_str_method(as_text(value).replace)
    return replace(as_text(old), as_text(new), -1 if count is None else count)


#: The filters that can grow a string past their input, bounded (tojson: HF's, no HTML escaping).
BOUNDED_FILTERS = {"tojson": tojson, "join": _join, "format": _format, "center": _center, "indent": _indent,
                   "replace": _replace}
