"""A client schema's references, resolved at admission exactly as the validator will resolve them.

Checking ``$ref`` against the document root was not enough: under ``{"$id": "http://x/sub.json"}``
``#/$defs/z`` means ``http://x/sub.json#/$defs/z``, which the validator could not find after
generation (a 500), and ``{"allOf": [{"$ref": "#"}]}`` or ``$recursiveRef`` back to the root made it
recurse without end (a RecursionError, another 500). Here every subschema gets the resolver the
validator's ``descend`` gives it (the same registry, entering each ``$id`` scope), every reference
is looked up through it, and the references and in-place keywords (``allOf``, ``not``, ``if`` ...:
those that check the *same* value again) must form no cycle: a recursive schema recurses through
``properties`` or ``items``, where each step checks a smaller part of the value, so it ends.
"""

from __future__ import annotations

from referencing import Specification
from referencing.jsonschema import lookup_recursive_ref, specification_with

from dlm_backend.errors import DLMError

#: Keywords whose subschemas check the same value again (the rest descend into a part of it), by
#: where they hold them: a schema, a list of schemas, an object of schemas (draft 3's extends: either).
IN_PLACE = {"not": "one", "if": "one", "then": "one", "else": "one", "allOf": "list", "anyOf": "list",
            "oneOf": "list", "extends": "list", "dependentSchemas": "object", "dependencies": "object"}
#: How many times the in-place references may make one value be checked by the same schema nodes:
#: ``d_i = {"allOf": [{"$ref": d_i+1}, {"$ref": d_i+1}]}`` is 2**n checks of one value for n defs.
MAX_IN_PLACE = 50_000


def check_references(schema: dict, cls, registry, where: str):
    """Refuse (DLMError naming ``where``) a reference that does not resolve the validator's way, one
    that lands outside the schema's subschemas, and in-place reference cycles or fan-outs. Returns
    the registry with every ``$id`` of the schema in it (the validator then never crawls again)."""
    spec = specification_with(cls.ID_OF(cls.META_SCHEMA) or "urn:unknown-dialect", default=Specification.OPAQUE)
    root = spec.create_resource(schema)
    base = root.id() or ""
    registry = registry.with_resource(base, root).crawl()
    nodes = _lexical(schema, spec, registry.resolver(base_uri=base))
    applicable = getattr(cls, "_APPLICABLE_VALIDATORS", dict.items)     # drafts <= 7 ignore $ref's siblings
    anchors: dict[str, list[int]] = {}
    for key, (contents, _) in nodes.items():
        if isinstance(contents, dict) and isinstance(contents.get("$dynamicAnchor"), str):
            anchors.setdefault(contents["$dynamicAnchor"], []).append(key)
    recursive = [k for k, (c, _) in nodes.items() if isinstance(c, dict) and c.get("$recursiveAnchor") is True]
    edges: dict[int, list[tuple[int, str]]] = {}
    for key, (contents, resolver) in nodes.items():
        if not isinstance(contents, dict):
            continue
        evaluated = dict(applicable(contents))
        out = edges[key] = []
        for word, holds in IN_PLACE.items():
            if word in evaluated and word in cls.VALIDATORS:
                out += [(id(sub), word) for sub in _schemas_in(evaluated[word], holds) if id(sub) in nodes]
        for word in ("$ref", "$dynamicRef"):
            ref = evaluated.get(word)
            if isinstance(ref, str) and word in cls.VALIDATORS:
                out.append((_target(resolver.lookup, ref, nodes, where), f"{word} {ref!r:.60}"))
                name = ref.partition("#")[2]
                if name and not name.startswith("/"):       # a dynamic anchor may resolve to any of its name
                    out += [(k, f"{word} {ref!r:.60}") for k in anchors.get(name, [])]
        if "$recursiveRef" in evaluated and "$recursiveRef" in cls.VALIDATORS:
            target = _target(lambda _: lookup_recursive_ref(resolver), "#", nodes, where)
            out += [(k, "$recursiveRef") for k in [target, *recursive]]
    _refuse_cycles(edges, where)
    return registry


def _lexical(schema, spec, resolver) -> dict[int, tuple[object, object]]:
    """Every subschema (``$defs`` included) by identity, with the resolver the validator gives it."""
    nodes: dict[int, tuple[object, object]] = {}
    stack = [(schema, resolver)]
    while stack:
        contents, resolver = stack.pop()
        if id(contents) in nodes:
            continue
        nodes[id(contents)] = (contents, resolver)
        if isinstance(contents, dict):
            for child in spec.subresources_of(contents):
                if isinstance(child, dict):
                    stack.append((child, resolver.in_subresource(spec.create_resource(child))))
                elif isinstance(child, bool):
                    stack.append((child, resolver))
    return nodes


def _schemas_in(value, holds: str) -> list:
    if holds == "object" and isinstance(value, dict):
        items = list(value.values())
    else:
        items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, (dict, bool))]


def _target(lookup, ref: str, nodes: dict, where: str) -> int:
    # Any failure of a lookup is the reference's fault: an unknown pointer or anchor, a pointer
    # through a string, an index that is not a number (referencing raises several types).
    try:
        contents = lookup(ref).contents
    except Exception:  # noqa: BLE001
        raise DLMError(f"{where}: $ref {ref!r:.100} does not resolve inside the schema (references resolve against "
                       "the nearest enclosing $id, as the validator reads them). Fix the reference.",
                       param=where) from None
    if id(contents) not in nodes:
        raise DLMError(f"{where}: $ref {ref!r:.100} points at a value that is not one of the schema's subschemas "
                       "(inside enum, const or an unknown keyword). Point it at a subschema, e.g. under $defs.",
                       param=where)
    return id(contents)


def _refuse_cycles(edges: dict[int, list[tuple[int, str]]], where: str) -> None:
    """Depth-first over the in-place edges: a back edge is a cycle; ``size`` counts the checks one
    value gets from each node, to refuse an exponential fan-out of references."""
    state: dict[int, int] = {}            # 1: on the path, 2: done
    size: dict[int, int] = {}
    for start in edges:
        if start in state:
            continue
        stack = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            for child, label in children:
                if state.get(child) == 1:
                    raise DLMError(f"{where}: the schema refers back to itself without descending into the value "
                                   f"(through {label}), so checking a value would never end. Recurse through "
                                   "properties or items instead.", param=where)
                if child not in state:
                    state[child] = 1
                    stack.append((child, iter(edges.get(child, ()))))
                    break
            else:
                stack.pop()
                state[node] = 2
                size[node] = min(MAX_IN_PLACE + 1, 1 + sum(size.get(c, 1) for c, _ in edges.get(node, ())))
                if size[node] > MAX_IN_PLACE:
                    raise DLMError(f"{where}: the schema's references make one value be checked over "
                                   f"{MAX_IN_PLACE} times (subschemas referenced twice at each of many levels). "
                                   "Reference each subschema once.", param=where)
