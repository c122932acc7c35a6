"""pydantic's JSON Schema (2020-12) said in the OpenAPI 3.0 dialect of the service's document, which
BentoML's document declares and Swagger UI and API fuzzers read: for the request bodies the routes
document themselves (`inline_schema`) and /generate's, which BentoML builds from its signature."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with every ``$ref`` replaced by its definition (no shared components),
    in the OpenAPI 3.0 dialect of the service's document (`openapi30`)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(copy.deepcopy(defs[ref.removeprefix("#/$defs/")]))
            return openapi30({key: resolve(value) for key, value in node.items()})
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def openapi30(node: dict[str, Any]) -> dict[str, Any]:
    """One schema node of pydantic's JSON Schema (2020-12) said the OpenAPI 3.0 way, which BentoML's
    document declares and Swagger UI and API fuzzers read: numeric exclusive bounds become booleans
    beside the bound, `const` an enum of one, and an `anyOf` with a null branch `nullable`."""
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = node.get(exclusive)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            node[bound], node[exclusive] = value, True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    branches = node.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        rest = [branch for branch in branches if branch != {"type": "null"}]
        node.pop("anyOf")
        if len(rest) == 1 and isinstance(rest[0], dict):
            node.update({**rest[0], **{k: v for k, v in node.items() if k not in rest[0]}})
        else:
            node["anyOf"] = rest
        node["nullable"] = True
    return node


def openapi30_tree(node: Any) -> Any:
    """Every schema node under `node` said the OpenAPI 3.0 way (`openapi30`), in place."""
    if isinstance(node, dict):
        for value in node.values():
            openapi30_tree(value)
        openapi30(node)
    elif isinstance(node, list):
        for item in node:
            openapi30_tree(item)
    return node
