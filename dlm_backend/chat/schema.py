"""JSON schemas from clients are data: checked at admission, never fetched, validated in bounded time.

jsonschema's default registry retrieves any ``$ref`` it does not know (``http://...`` made the
server fetch a URL, ``file:///...`` opened local files, with no timeout), and its ``pattern`` keyword
runs Python's backtracking ``re`` (``^(a|aa)+$`` froze the server). Here every ``$ref`` must point
inside the schema itself and resolve there the way the validator will resolve it (schema_refs.py),
the registry retrieves nothing, what one request's schemas may cost is bounded before any work
proportional to it (:class:`Budget`), and one check of a value has a deadline shared by all of its
keywords and patterns (:data:`VALIDATION_SECONDS`). Patterns run in bounded time and memory
(schema_patterns.py says how, and why not RE2).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import jsonschema
import regex
from referencing import Registry
from referencing.exceptions import Unresolvable

from dlm_backend.chat.schema_patterns import (DEADLINE, MAX_UNROLLED, MAX_UNROLLED_TOTAL, OutOfTime,
                                              additional_properties_keyword, compiled, pattern_keyword,
                                              pattern_properties_keyword, unrolled_size)
from dlm_backend.chat.schema_refs import check_references
from dlm_backend.errors import DLMError

MAX_NODES = 5000                # objects, arrays and values in all of one request's schemas
MAX_DEPTH = 32
#: One check of one value against a schema, all keywords and patterns together. 200 patterns of
#: 50 ms each took 10 s a check (42 s a request with its resamples) before there was one deadline.
VALIDATION_SECONDS = 0.25
REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def _refuse(uri: str):
    raise DLMError(f"The schema references {uri!r}; only references inside the schema itself ('#/...') are "
                   "allowed. Inline the referenced schema.")


_REGISTRY = Registry(retrieve=_refuse)


@dataclass
class Budget:
    """What one request's schemas (its response_format and every tool's parameters) may cost in all."""

    nodes: int = MAX_NODES
    unrolled: int = MAX_UNROLLED_TOTAL


def check_schema(schema, where: str = "response_format", budget: Budget | None = None) -> dict:
    """``schema`` if it is a valid, self-contained JSON Schema of bounded size, else a DLMError
    naming ``where`` and the problem (a remote or file ``$ref``, one that does not resolve or that
    cycles, a pattern that does not compile or unrolls too far, too many nodes). ``budget`` is shared
    by the schemas of one request."""
    check_schemas([(schema, where)], budget)
    return schema


def check_schemas(schemas: list[tuple[object, str]], budget: Budget | None = None) -> None:
    """:func:`check_schema` for several ``(schema, where)`` of one request: all are measured against
    the budget before any is checked against its meta-schema (~0.1 ms a node), so 20 tools of 1,600
    properties are refused at once rather than after the first tool's check."""
    budget = budget if budget is not None else Budget()
    for schema, where in schemas:
        if not isinstance(schema, dict):
            raise DLMError(f"{where}: a JSON schema must be an object, not {type(schema).__name__}.", param=where)
        refs: list[str] = []
        seen: set[str] = set()
        _walk(schema, where, refs, budget, seen)
        if {"unevaluatedProperties", "patternProperties"} <= seen:
            # jsonschema matches patternProperties for unevaluatedProperties on Python's re, which
            # no deadline can stop; additionalProperties says the same for most schemas.
            raise DLMError(f"{where}: unevaluatedProperties together with patternProperties is not supported (its "
                           "patterns could not be time-limited); use additionalProperties.", param=where)
        for ref in refs:
            if not ref.startswith("#"):
                raise DLMError(f"{where}: $ref {ref!r:.100} points outside the schema; only local references "
                               "('#/...') are allowed. Inline the referenced schema.", param=where)
    for schema, where in schemas:
        try:
            _draft(schema).check_schema(schema)      # jsonschema's own class: the deadline is for values
        except jsonschema.exceptions.SchemaError as exc:
            raise DLMError(f"{where}: not a valid JSON schema: {exc.message:.300}. Fix the schema "
                           "(https://json-schema.org).", param=where) from None
        check_references(schema, _validator_class(schema), _REGISTRY, where)


def validates(schema: dict, value) -> bool:
    """Whether ``value`` is valid against an admitted ``schema``. A pattern that runs out of its
    own time counts as not matching; a check that runs out of :data:`VALIDATION_SECONDS` in all is
    a DLMError, as is a schema the validator cannot evaluate (never a 500 after generation)."""
    cls = _validator_class(schema)
    registry = check_references(schema, cls, _REGISTRY, "schema")       # bounded by MAX_NODES, not the deadline
    token = DEADLINE.set(time.monotonic() + VALIDATION_SECONDS)
    try:
        return cls(schema, registry=registry).is_valid(value)
    except OutOfTime:
        raise DLMError(f"Checking the answer against the schema took over {VALIDATION_SECONDS:g} s and was stopped "
                       "(patterns that backtrack, or many alternatives); simplify the schema.") from None
    except RecursionError:
        return False                    # a value nested deeper than the checker can follow is no answer
    except (Unresolvable, jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType,
            AttributeError, TypeError, KeyError, ValueError, IndexError) as exc:
        # Admission resolves every reference and checks the schema; this is the backstop.
        raise DLMError(f"The schema could not be evaluated ({type(exc).__name__}: {str(exc):.200}); fix the "
                       "schema.") from None
    finally:
        DEADLINE.reset(token)


def _walk(node, where: str, refs: list[str], budget: Budget, seen: set[str], depth: int = 0) -> None:
    budget.nodes -= 1
    if budget.nodes < 0 or depth > MAX_DEPTH:
        raise DLMError(f"{where}: the schema is too large (over {MAX_NODES} nodes in all of the request's schemas, "
                       f"or {MAX_DEPTH} levels deep). Send smaller schemas or fewer tools.", param=where)
    if isinstance(node, dict):
        seen.update(k for k in ("unevaluatedProperties", "patternProperties") if k in node)
        for key, value in node.items():
            if key in REF_KEYS and isinstance(value, str):
                refs.append(value)
            if key == "pattern" and isinstance(value, str):
                _check_pattern(value, where, budget)
            if key == "patternProperties" and isinstance(value, dict):
                for pattern in value:
                    _check_pattern(pattern, where, budget)
            _walk(value, where, refs, budget, seen, depth + 1)
    elif isinstance(node, list):
        for value in node:
            _walk(value, where, refs, budget, seen, depth + 1)


def _check_pattern(regex_text: str, where: str, budget: Budget) -> None:
    size = unrolled_size(regex_text)
    budget.unrolled -= size
    if size > MAX_UNROLLED or budget.unrolled < 0:
        raise DLMError(f"{where}: pattern {regex_text!r:.80} repeats too much ({size} characters to match when its "
                       f"counted repeats are unrolled; the limit is {MAX_UNROLLED} a pattern, {MAX_UNROLLED_TOTAL} "
                       "a request). Use smaller {m,n} counts.", param=where)
    try:
        compiled(regex_text)
    except (regex.error, RecursionError, OverflowError) as exc:
        raise DLMError(f"{where}: pattern {regex_text!r:.80} is not a valid regular expression ({exc}).",
                       param=where) from None


def _timed(keyword):
    """A keyword that first checks the validation's deadline: every subschema a check reaches goes
    through one, so fan-outs of ``anyOf`` and references stop there too, not only patterns."""
    @functools.wraps(keyword)
    def run(validator, value, instance, schema):
        if time.monotonic() > DEADLINE.get():
            raise OutOfTime
        return keyword(validator, value, instance, schema)
    return run


_EXTENDED: dict = {}


def _draft(schema: dict):
    """jsonschema's validator class for the schema's ``$schema`` (an unknown one reads as 2020-12)."""
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _validator_class(schema: dict):
    """The schema's draft, with patterns on the bounded engine (schema_patterns.py) and every keyword
    under the deadline (one class per draft)."""
    base = _draft(schema)
    if base not in _EXTENDED:
        keywords = {**base.VALIDATORS, "pattern": pattern_keyword, "patternProperties": pattern_properties_keyword,
                    "additionalProperties": additional_properties_keyword}
        _EXTENDED[base] = jsonschema.validators.extend(base, {k: _timed(v) for k, v in keywords.items()})
    return _EXTENDED[base]
