"""Structured output: which schemas the answer can be written into, and reading JSON back.

A schema is *templatable* when its keys can be written by the chat layer and only its values left
to the model (chat/json_writer.py writes such an answer a value at a time): an object whose
properties are strings, numbers, integers, booleans, enums, constants, nulls, arrays of those, or
objects of the same kind, optional ones included. Other schemas (arrays of objects, unions) and
``json_object`` get a ``{"`` prefix and are validated after generation (jsonschema); the chat layer
samples again when the answer does not validate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dlm_backend.chat.prompt import MARKERS
from dlm_backend.chat.schema import Budget, check_schema, validates
from dlm_backend.errors import DLMError


@dataclass
class JsonPlan:
    """How a structured answer is produced: written into the schema's keys (``templated``), or
    generated after ``prefix`` and validated."""

    schema: dict | None
    templated: bool
    prefix: list[int] = field(default_factory=list)

    def parse(self, text: str) -> tuple[object, str]:
        """(parsed value or None, JSON text) of a generated answer."""
        value = loads_lenient(text)
        return (value if value is not None and self.matches(value) else None), text

    def matches(self, value) -> bool:
        """Whether ``value`` validates against the schema (any JSON value does for ``json_object``)."""
        return self.schema is None or validates(self.schema, value)


def nearest(options: list, written: str):
    """The option closest to what the model wrote (characters that differ in place, plus length);
    the first one on a tie."""
    def distance(option) -> int:
        a = str(option)
        return sum(x != y for x, y in zip(a, written)) + abs(len(a) - len(written))
    return min(options, key=distance)


def loads_lenient(text: str):
    """JSON from model text: the whole text, else its outermost {...}; None when neither parses."""
    for candidate in (text, text[text.find("{"):text.rfind("}") + 1] if "{" in text else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def templatable(schema: dict) -> bool:
    """Whether the answer to ``schema`` can be written key by key (see the module docstring)."""
    props = schema.get("properties")
    return (schema.get("type", "object") == "object" and isinstance(props, dict) and bool(props)
            and all(isinstance(p, dict) and slot_kind(scalar(p)) is not None for p in props.values()))


def slot_kind(prop: dict) -> str | None:
    """How a property's value is written, or None when it cannot be (an enum mixing strings and
    numbers, an array of objects, a union: generated and validated instead)."""
    if "const" in prop:
        return "const"
    if "enum" in prop:
        values = prop["enum"] if isinstance(prop["enum"], list) else []
        if values and all(isinstance(v, str) for v in values):
            return "string"
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return "enum"
        return None
    kind = prop.get("type")
    if kind == "object":
        return "object" if templatable(prop) else None
    if kind == "array":
        items = prop.get("items")
        scalar_items = isinstance(items, dict) and scalar(items).get("type") in ("string", "integer", "number",
                                                                                 "boolean")
        return "array" if items is None or scalar_items else None
    return kind if kind in ("string", "integer", "number", "boolean", "null") else None


def scalar(prop: dict) -> dict:
    """An optional property (``Optional[str]`` in pydantic: ``anyOf: [{type: string}, {type: null}]``,
    ``type: [string, null]``, or an enum listing null as OpenAI's structured-output guide writes an
    optional enum) as its non-null type; the answer always fills it in."""
    branches = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(branches, list):
        kept = [b for b in branches if isinstance(b, dict) and b.get("type") != "null"]
        return scalar(kept[0]) if len(kept) == 1 else prop
    if isinstance(prop.get("type"), list):
        kept = [t for t in prop["type"] if t != "null"]
        prop = {**prop, "type": kept[0]} if len(kept) == 1 else prop
    if isinstance(prop.get("enum"), list) and None in prop["enum"] and len(prop["enum"]) > 1:
        prop = {**prop, "enum": [v for v in prop["enum"] if v is not None]}
    return prop


def _written_strings(schema: dict) -> list[str]:
    """The property names, enum values and constants of ``schema`` and its subschemas: what the
    writer writes for the model (a loop: schemas nest deep)."""
    out, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            props = node.get("properties")
            out += [k for k in props if isinstance(k, str)] if isinstance(props, dict) else []
            out += [v for v in node.get("enum", []) if isinstance(v, str)] if isinstance(node.get("enum"), list) else []
            out += [node["const"]] if isinstance(node.get("const"), str) else []
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
    return out


def schema_of(response_format: dict) -> dict | None:
    """The JSON schema of an OpenAI ``response_format`` (None for ``json_object``)."""
    kind = response_format.get("type")
    if kind == "json_object":
        return None
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise DLMError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}.")
        return schema
    raise DLMError(f"response_format type {kind!r} is not supported; use 'json_object' or 'json_schema'.")


def plan_json(tokenizer, response_format: dict, max_tokens: int, budget: Budget | None = None) -> JsonPlan:
    """How to answer ``response_format`` (``budget``: what is left of the request's schema budget
    after its tools)."""
    schema = schema_of(response_format)
    if schema is not None:
        check_schema(schema, "response_format", budget)
    if schema is None or not templatable(schema):
        return JsonPlan(schema, False, tokenizer.encode('{"'))
    check_fits(tokenizer, schema, max_tokens, "The JSON schema")
    return JsonPlan(schema, True)


def check_fits(tokenizer, schema: dict, max_tokens: int, what: str, head: str = "", tail: str = "") -> None:
    """A DLMError when the schema's keys with one token a value already exceed ``max_tokens``, or
    when a key, enum value or constant the chat layer writes into the answer holds a control token's
    text (the model would read it as that token: a forged end of turn inside its own answer)."""
    written = _written_strings(schema)
    found = tokenizer.control_tokens(MARKERS).spans(written)
    if found:
        k, spans = next(iter(found.items()))
        start, end = spans[0]
        raise DLMError(f"{what} has {written[k]!r:.80}, which holds the control token {written[k][start:end]!r}: "
                       "the answer writes keys, enum values and constants as they are, so rename it.")
    keys = head + json.dumps({k: 0 for k in schema["properties"]}) + tail
    need = len(tokenizer.encode(keys))
    if need > max_tokens:
        raise DLMError(f"{what} needs at least {need} tokens for its keys and values; raise max_tokens "
                       f"(now {max_tokens}).")
