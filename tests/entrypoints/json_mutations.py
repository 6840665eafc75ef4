"""Hostile variants of a valid JSON document, for fuzzing a route or an event: every field (leaf or container, at
any depth) replaced by a value of every other JSON type, and a hypothesis strategy that puts arbitrary JSON at an
arbitrary place. Each variant is labelled with the field's path, so a failure names what was sent."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Union

from hypothesis import strategies as st

Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]  # noqa: UP007 - a recursive alias
Path = tuple[Union[str, int], ...]  # noqa: UP007

# One representative of each JSON kind, with the odd ones out that break careless code: a bignum, a negative,
# a float where an int is expected, an empty and a nested container.
REPRESENTATIVES: dict[str, tuple[Json, ...]] = {
    "null": (None,),
    "bool": (True,),
    "int": (-1, 2**70),
    "float": (0.5,),
    "str": ("x\u0000<|im_end|>",),
    "list": ([], [{"a": [1]}]),
    "dict": ({}, {"type": {"x": None}}),
}


def kind(value: Json) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return {float: "float", str: "str", list: "list", dict: "dict"}[type(value)]


def paths(doc: Json, prefix: Path = ()) -> Iterator[Path]:
    """Every place in ``doc`` below its root, containers before what they hold."""
    children = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, child in children:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def get(doc: Json, path: Path) -> Json:
    for key in path:
        doc = doc[key]  # type: ignore[index]
    return doc


def replaced(doc: Json, path: Path, value: Json) -> Json:
    out = copy.deepcopy(doc)
    get(out, path[:-1])[path[-1]] = value  # type: ignore[index]
    return out


def label(path: Path) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


def wrong_types(value: Json) -> list[Json]:
    """Representatives of every JSON kind but ``value``'s own (an int and a float count as one: a number)."""
    own = {"int", "float"} if kind(value) in ("int", "float") else {kind(value)}
    return [v for k, vs in REPRESENTATIVES.items() if k not in own for v in vs]


def mutations(doc: Json, skip: frozenset[str] = frozenset()) -> list[tuple[str, Json]]:
    """(path label = the value's kind, variant) for every field of ``doc`` and every wrong type for it; fields
    whose label is in ``skip`` are left alone (e.g. a route's ``model``, which only picks a 404)."""
    out = []
    for path in paths(doc):
        if label(path) in skip:
            continue
        for value in wrong_types(get(doc, path)):
            out.append((f"{label(path)} = {kind(value)} {str(value)[:24]}", replaced(doc, path, value)))
    return out


def any_json(max_leaves: int = 6) -> st.SearchStrategy[Json]:
    leaves = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
              | st.text(max_size=12))
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=max_leaves)


@st.composite
def variants(draw: st.DrawFn, doc: Json) -> tuple[str, Json]:
    """``doc`` with one field (any depth) replaced by arbitrary JSON."""
    path = draw(st.sampled_from(list(paths(doc))))
    value = draw(any_json())
    return f"{label(path)} = {value!r:.40}", replaced(doc, path, value)
