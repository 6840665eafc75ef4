"""Values computed from an object, remembered while that very object lives.

A realtime conversation renders every earlier user turn's audio again at each
new turn; the audio arrays (and :class:`~omnistage.processing.listened_audio.ListenedAudio`)
are the same objects from turn to turn, never changed in place, so their
features need computing once. NumPy arrays cannot be dict keys (no hash), so the
memo keys by identity and holds a weak reference: an entry goes with its object,
and an id the interpreter reuses for a new object never finds the old value.

Worker threads share one memo: each operation is a single dict call (atomic
under the GIL), and two threads computing the same value at once both store an
equal one. The weak reference's callback may run inside any of them, so it
takes no lock.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """``get(key, compute)``: ``compute(key)`` once per living ``key`` object."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[K], V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, compute: Callable[[K], V]) -> V:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
        value = compute(key)
        try:
            ref = weakref.ref(key, self._forget(id(key)))
        except TypeError:  # not weakly referable: not remembered
            return value
        self._entries[id(key)] = (ref, value)
        return value

    def _forget(self, ident: int) -> Callable[[weakref.ref[K]], None]:
        def forget(ref: weakref.ref[K]) -> None:
            entry = self._entries.get(ident)
            if entry is not None and entry[0] is ref:  # not a newer object's entry under a reused id
                self._entries.pop(ident, None)
        return forget
