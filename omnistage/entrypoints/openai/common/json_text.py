"""JSON text a client sends must decode to valid Unicode: a lone UTF-16 surrogate escape is refused up front.

``"\\ud800"`` is valid JSON but no valid string: Python decodes it to a str that cannot be encoded to UTF-8, so it
would fail far from where it entered (the tokenizer, an echoed WebSocket event) as a 500 or a dropped socket.
:func:`lone_surrogate` finds one in the raw text without building any object: each ``\\uD800``-``\\uDFFF`` escape
(behind an odd run of backslashes: a real escape) must be a high one followed at once by a low one.
"""

from __future__ import annotations

import re

_ESCAPE = r"\\+u[dD][89a-fA-F][0-9a-fA-F]{2}"
_BYTES = re.compile(_ESCAPE.encode())
_TEXT = re.compile(_ESCAPE)
_HIGH = frozenset("89abAB")


def lone_surrogate(raw: str | bytes) -> bool:
    """Whether ``raw`` JSON text holds a surrogate escape that is not half of a pair."""
    if (b"\\" if isinstance(raw, bytes) else "\\") not in raw:  # no escape at all (base64 media): a memchr, not a regex
        return False
    pending = -1  # where the low half of a pair must start, after a high half
    for m in (_BYTES if isinstance(raw, bytes) else _TEXT).finditer(raw):
        text = m.group().decode() if isinstance(raw, bytes) else m.group()
        slashes = text.index("u")
        if slashes % 2 == 0:  # an escaped backslash, then the letters "ud8.."
            continue
        high = text[slashes + 2] in _HIGH
        if pending >= 0:
            if high or m.end() - 6 != pending:
                return True
            pending = -1
        elif high:
            pending = m.end()
        else:
            return True
    return pending >= 0


LONE_SURROGATE = "the JSON holds a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a pair): it is no valid text"
