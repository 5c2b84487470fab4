"""JSON schemas from clients are data: checked at admission, never fetched, validated in bounded time.

jsonschema's default registry retrieves any ``$ref`` it does not know (``http://...`` made the
server fetch a URL, ``file:///...`` opened local files, with no timeout), and its ``pattern`` keyword
runs Python's backtracking ``re`` (``^(a|aa)+$`` froze the server). Here every ``$ref`` must point
inside the schema itself and resolve there, the registry retrieves nothing, a schema's size is
bounded before any work proportional to it, and patterns run on the ``regex`` engine with a time
limit (it also releases the GIL while it matches).
"""

from __future__ import annotations

import jsonschema
import regex
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

from dlm_backend.errors import DLMError

MAX_NODES = 5000                # objects, arrays and values in one schema
MAX_DEPTH = 32
PATTERN_SECONDS = 0.05          # one pattern against one value
REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def _refuse(uri: str):
    raise DLMError(f"The schema references {uri!r}; only references inside the schema itself ('#/...') are "
                   "allowed. Inline the referenced schema.")


_REGISTRY = Registry(retrieve=_refuse)


def check_schema(schema, where: str = "response_format") -> dict:
    """``schema`` if it is a valid, self-contained JSON Schema of bounded size, else a DLMError
    naming ``where`` and the problem (a remote or file ``$ref``, one that does not resolve, a
    pattern that does not compile, too many nodes)."""
    if not isinstance(schema, dict):
        raise DLMError(f"{where}: a JSON schema must be an object, not {type(schema).__name__}.", param=where)
    refs: list[str] = []
    _walk(schema, where, refs)
    for ref in refs:
        if not ref.startswith("#"):
            raise DLMError(f"{where}: $ref {ref!r:.100} points outside the schema; only local references "
                           "('#/...') are allowed. Inline the referenced schema.", param=where)
    cls = _validator_class(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise DLMError(f"{where}: not a valid JSON schema: {exc.message:.300}. Fix the schema "
                       "(https://json-schema.org).", param=where) from None
    resolver = _REGISTRY.resolver_with_root(_resource(schema))
    for ref in refs:
        try:
            resolver.lookup(ref)
        except (Unresolvable, DLMError, ValueError, KeyError, TypeError):
            raise DLMError(f"{where}: $ref {ref!r:.100} does not resolve inside the schema. Fix the reference.",
                           param=where) from None
    return schema


def validates(schema: dict, value) -> bool:
    """Whether ``value`` is valid against an admitted ``schema`` (patterns time-bounded: a pattern
    that runs out of time counts as not matching)."""
    return _validator_class(schema)(schema, registry=_REGISTRY).is_valid(value)


def _walk(node, where: str, refs: list[str], depth: int = 0, count: list[int] | None = None) -> None:
    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH:
        raise DLMError(f"{where}: the schema is too large (over {MAX_NODES} nodes or {MAX_DEPTH} levels deep).",
                       param=where)
    if isinstance(node, dict):
        for key, value in node.items():
            if key in REF_KEYS and isinstance(value, str):
                refs.append(value)
            if key == "pattern" and isinstance(value, str):
                _compile(value, where)
            if key == "patternProperties" and isinstance(value, dict):
                for pattern in value:
                    _compile(pattern, where)
            _walk(value, where, refs, depth + 1, count)
    elif isinstance(node, list):
        for value in node:
            _walk(value, where, refs, depth + 1, count)


def _compile(pattern: str, where: str):
    try:
        return regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as exc:
        raise DLMError(f"{where}: pattern {pattern!r:.80} is not a valid regular expression ({exc}).",
                       param=where) from None


def _search(pattern: str, value: str) -> bool:
    try:
        return regex.search(pattern, value, timeout=PATTERN_SECONDS) is not None
    except (TimeoutError, regex.error):
        return False


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r:.80} does not match {pattern!r:.80}")


def _pattern_properties(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


_EXTENDED: dict = {}


def _validator_class(schema: dict):
    """The schema's draft, with patterns run by :func:`_search` (one class per draft)."""
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if base not in _EXTENDED:
        _EXTENDED[base] = jsonschema.validators.extend(
            base, {"pattern": _pattern, "patternProperties": _pattern_properties})
    return _EXTENDED[base]


def _resource(schema: dict):
    dialect = schema.get("$schema") if isinstance(schema.get("$schema"), str) else ""
    return specification_with(dialect, default=DRAFT202012).create_resource(schema)
