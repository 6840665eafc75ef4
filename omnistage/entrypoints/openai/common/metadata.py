"""``metadata``: the key-value pairs a client attaches to a response (``/v1/responses``, realtime ``response.create``),
kept with it and sent back. Bounded as OpenAI bounds it: at most 16 pairs, keys of at most 64 characters, values of
at most 512, strings only.

A stored response keeps its metadata for as long as it is stored, so the bound is checked before anything is built
from it: on the raw JSON first (longer than the largest metadata that can fit the bound, however escaped: refused
unread), then on the decoded pairs.
"""

from __future__ import annotations

MAX_PAIRS = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512
# A character takes at most 12 bytes of JSON (a surrogate pair, both halves \u-escaped); the quotes, colon and comma
# of each pair and the braces are the rest.
MAX_JSON_BYTES = MAX_PAIRS * ((MAX_KEY_CHARS + MAX_VALUE_CHARS) * 12 + 6) + 2
BOUNDS = (f"at most {MAX_PAIRS} pairs, keys of at most {MAX_KEY_CHARS} characters and string values of at most "
          f"{MAX_VALUE_CHARS}")


def json_fault(size: int) -> str | None:
    """Why ``size`` bytes of JSON cannot be metadata within the bounds, or None."""
    if size > MAX_JSON_BYTES:
        return f"metadata is {size} bytes of JSON, more than any metadata within OpenAI's bounds ({BOUNDS})"
    return None


def metadata_fault(metadata: object) -> str | None:
    """Why ``metadata`` (decoded JSON) breaks the bounds, or None (None is no metadata)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "metadata must be an object of string keys and values"
    if len(metadata) > MAX_PAIRS:
        return f"metadata holds {len(metadata)} pairs; the limit is {MAX_PAIRS} ({BOUNDS})"
    for key, value in metadata.items():
        if not isinstance(value, str):
            return "metadata values must be strings"
        if len(key) > MAX_KEY_CHARS:
            return f"a metadata key is {len(key)} characters; the limit is {MAX_KEY_CHARS}"
        if len(value) > MAX_VALUE_CHARS:
            return f"a metadata value is {len(value)} characters; the limit is {MAX_VALUE_CHARS}"
    return None
