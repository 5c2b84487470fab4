"""A client schema's references (chat/schema_refs.py): resolved at admission as the validator will
resolve them, no cycles in place, and no fan-out that checks one value millions of times."""

from __future__ import annotations

import pytest

from dlm_backend.chat.schema import check_schema, validates
from dlm_backend.errors import DLMError


DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"


@pytest.mark.parametrize("schema, says", [
    # resolves from the root but not from its $id: the validator looks in http://x/sub.json
    ({"allOf": [{"$id": "http://x/sub.json", "$ref": "#/$defs/z"}], "$defs": {"z": {"type": "string"}}}, "$id"),
    ({"allOf": [{"$ref": "#"}]}, "refers back to itself"),
    ({"$schema": DRAFT2019, "$recursiveRef": "#"}, "refers back to itself"),
    ({"$schema": DRAFT2019, "$recursiveAnchor": True, "anyOf": [{"$recursiveRef": "#"}]}, "refers back to itself"),
    ({"$dynamicAnchor": "n", "anyOf": [{"$dynamicRef": "#n"}]}, "refers back to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
     "refers back to itself"),
    ({"enum": [{"type": "string"}], "$ref": "#/enum/0"}, "not one of the schema's subschemas"),
    ({"properties": {"a": {"type": "string"}}, "$ref": "#/properties"}, "not one of the schema's subschemas"),
    # 2**24 checks of one value through references that each appear twice
    ({"$defs": {**{f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(24)},
                "d24": {"type": "string"}}, "$ref": "#/$defs/d0"}, "checked over"),
])
def test_references_the_validator_cannot_follow_are_refused_at_admission(schema, says):
    with pytest.raises(DLMError, match="response_format") as err:
        check_schema(schema)
    assert says in str(err.value)


@pytest.mark.parametrize("schema, good, bad", [
    ({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
      "$ref": "#/$defs/node"}, {"next": {"next": {}}}, {"next": 5}),
    ({"allOf": [{"$id": "http://x/sub.json", "$ref": "#/$defs/z", "$defs": {"z": {"type": "string"}}}]}, "a", 5),
    ({"$schema": DRAFT2019, "$recursiveAnchor": True, "type": "object",
      "additionalProperties": {"$recursiveRef": "#"}}, {"a": {"b": {}}}, {"a": 5}),
    ({"$dynamicAnchor": "n", "type": "array", "items": {"$dynamicRef": "#n"}}, [[[]]], [[5]]),
])
def test_recursion_through_the_value_is_admitted_and_validates(schema, good, bad):
    check_schema(schema)
    assert validates(schema, good) and not validates(schema, bad)
