"""Structured output: a JSON skeleton written into the canvas, only the value slots denoised.

For an object schema whose properties are strings, numbers, integers, booleans or enums, the keys,
quotes and punctuation are fixed tokens of the response template and each value gets a run of free
slots. Diffusion fills the slots with the whole skeleton in view, and each value is read from its
slot up to its closing delimiter and coerced to the property's type, so the result always parses
and has exactly the schema's keys and types. Other schemas (nested objects, arrays) and
``json_object`` get a ``{"`` prefix and are validated after generation (jsonschema); the chat
layer samples again when the answer does not validate.

Pieces are tokenised on the boundaries byte-level BPE uses for JSON (``{"``, ``":``, `` "``, ``",``),
so the fixed tokens are the ones the model itself writes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from dlm_backend.chat.schema import Budget, check_schema, validates
from dlm_backend.errors import DLMError

STRING_SLOTS = 8
NUMBER_SLOTS = 3
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Slot:
    key: str
    kind: str          # string | integer | number | boolean | enum
    start: int         # token range in the response
    end: int


@dataclass
class JsonPlan:
    """The response template of a structured-output request and how to read the answer back."""

    template: list[int | None]
    schema: dict | None
    slots: list[Slot] = field(default_factory=list)

    def parse(self, tokenizer, token_ids: list[int], text: str) -> tuple[object, str]:
        """(parsed value or None, JSON text)."""
        if not self.slots:
            value = loads_lenient(text)
            return (value if value is not None and self.matches(value) else None), text
        out = self.slot_values(tokenizer, token_ids)
        # The skeleton fixes keys and types; bounds, patterns and required keys it cannot hold are
        # checked here (an age slot left at 0 against minimum 18 was returned as parsed).
        return (out if self.matches(out) else None), json.dumps(out, ensure_ascii=False)

    def slot_values(self, tokenizer, token_ids: list[int]) -> dict:
        """The skeleton's value slots read back as their types."""
        props = self.schema["properties"]
        return {slot.key: _coerce(tokenizer.decode(token_ids[slot.start:slot.end]), slot.kind, _scalar(props[slot.key]))
                for slot in self.slots}


    def matches(self, value) -> bool:
        """Whether ``value`` validates against the schema (any JSON value does for ``json_object``)."""
        return self.schema is None or validates(self.schema, value)


def _coerce(raw: str, kind: str, prop: dict):
    if kind == "string":
        value = raw.split('"')[0].strip()
        if "enum" in prop and value not in prop["enum"]:
            value = nearest(prop["enum"], value)
        return value
    if kind == "boolean":
        return raw.strip().lower().startswith("t")
    m = _NUMBER.search(raw)
    number = float(m.group()) if m else 0.0
    if kind == "enum":
        return min(prop["enum"], key=lambda v: abs(float(v) - number))
    return int(number) if kind == "integer" or number.is_integer() else number


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
    props = schema.get("properties")
    return (schema.get("type", "object") == "object" and isinstance(props, dict) and bool(props)
            and all(isinstance(p, dict) and _slot_kind(_scalar(p)) is not None for p in props.values()))


def _slot_kind(prop: dict) -> str | None:
    """How a property is filled: a quoted or a bare slot, or None when the skeleton cannot hold it
    (an enum mixing strings and numbers reads back as neither, so it is generated and validated)."""
    if "enum" in prop:
        values = prop["enum"] if isinstance(prop["enum"], list) else []
        if values and all(isinstance(v, str) for v in values):
            return "string"
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return "enum"
        return None
    return prop.get("type") if prop.get("type") in ("string", "integer", "number", "boolean") else None


def _scalar(prop: dict) -> dict:
    """An optional property (``Optional[str]`` in pydantic: ``anyOf: [{type: string}, {type: null}]``,
    ``type: [string, null]``, or an enum listing null as OpenAI's structured-output guide writes an
    optional enum) as its non-null type; the skeleton always fills it in."""
    branches = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(branches, list):
        kept = [b for b in branches if isinstance(b, dict) and b.get("type") != "null"]
        return _scalar(kept[0]) if len(kept) == 1 else prop
    if isinstance(prop.get("type"), list):
        kept = [t for t in prop["type"] if t != "null"]
        prop = {**prop, "type": kept[0]} if len(kept) == 1 else prop
    if "const" in prop:                 # pydantic's Literal["x"]: an enum of one, written by the skeleton
        prop = {**prop, "enum": [prop["const"]]}
    if isinstance(prop.get("enum"), list) and None in prop["enum"]:
        prop = {**prop, "enum": [v for v in prop["enum"] if v is not None]}
    return prop


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
    """Skeleton template for a templatable schema, else a ``{"`` prefix (``budget``: what is left of
    the request's schema budget after its tools)."""
    schema = schema_of(response_format)
    if schema is not None:
        check_schema(schema, "response_format", budget)
    if schema is None or not templatable(schema):
        return JsonPlan(tokenizer.encode('{"'), schema)
    template, slots = _skeleton(tokenizer, schema)
    _check_fits(template, max_tokens, "The JSON schema")
    return JsonPlan(template, schema, slots)


def plan_tool_call(tokenizer, head: str, parameters: dict, tail: str, max_tokens: int) -> JsonPlan | None:
    """A forced call to a known tool as a skeleton: ``head`` (the call up to its arguments), the
    arguments object with value slots, ``tail``. Only the argument values are denoised, so the call
    always parses and has the tool's argument names and types, whatever the model. None when the
    parameters cannot be templated (nested objects, arrays): the caller writes ``head`` only."""
    if parameters.get("properties"):
        if not templatable(parameters):
            return None
        body, slots = _skeleton(tokenizer, parameters)
    else:                                      # no arguments: the whole call is fixed text
        body, slots = tokenizer.encode("{}"), []
    start = tokenizer.encode(head)
    template = start + body + tokenizer.encode(tail)
    _check_fits(template, max_tokens, "The forced tool call")
    shifted = [Slot(s.key, s.kind, s.start + len(start), s.end + len(start)) for s in slots]
    return JsonPlan(template, parameters, shifted)


def _skeleton(tokenizer, schema: dict) -> tuple[list[int | None], list[Slot]]:
    template: list[int | None] = []
    slots: list[Slot] = []
    for key, prop in schema["properties"].items():
        kind = _slot_kind(_scalar(prop))
        quoted = kind == "string"
        lead = '{"' if not slots else ('", "' if slots[-1].kind == "string" else ', "')
        template += tokenizer.encode(lead + json.dumps(key)[1:-1] + '":' + (' "' if quoted else ""))
        n = STRING_SLOTS if quoted else NUMBER_SLOTS
        slots.append(Slot(key, kind, len(template), len(template) + n))
        template += [None] * n
    template += tokenizer.encode('"}' if slots[-1].kind == "string" else "}")
    return template, slots


def _check_fits(template: list, max_tokens: int, what: str) -> None:
    if len(template) > max_tokens:
        raise DLMError(f"{what} needs {len(template)} tokens of skeleton and value slots; "
                       f"raise max_tokens (now {max_tokens}).")
