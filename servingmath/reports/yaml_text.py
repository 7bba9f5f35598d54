"""Block-style YAML written by hand (no YAML dependency) for the manifests of ``--emit``.

Only what a Kubernetes manifest needs: mappings, sequences, strings, integers, booleans and
``None``.  Every string is a JSON string literal, which is a valid YAML double-quoted scalar
(YAML 1.2 is a superset of JSON), so no value can be misread as a number, a boolean, a comment
or an anchor.  Keys are plain identifiers as Kubernetes spells them (``nvidia.com/gpu`` included).
"""

from __future__ import annotations

import json
import re

INDENT = "  "
"""Two spaces per nesting level (the Kubernetes documentation's style)."""

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")


def dump(value: object) -> str:
    """``value`` (dict / list / str / int / bool / None, nested) as block YAML text."""
    return "\n".join(_lines(value, 0)) + "\n"


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _key(key: str) -> str:
    if not _PLAIN_KEY.match(key):
        raise ValueError(f"YAML key {key!r} is not a plain identifier")
    return key


def _lines(value: object, depth: int) -> list[str]:
    pad = INDENT * depth
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{_key(k)}:")
                out += _lines(v, depth + (0 if isinstance(v, list) else 1))
            else:
                out.append(f"{pad}{_key(k)}: {_empty(v)}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _lines(item, depth + 1)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out += inner[1:]
            else:
                out.append(f"{pad}- {_empty(item)}")
        return out
    return [pad + _scalar(value)]


def _empty(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)
