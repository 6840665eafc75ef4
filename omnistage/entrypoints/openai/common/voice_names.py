"""Voice names a request may use: the checkpoint's speakers, and OpenAI's voice names mapped onto them.

OpenAI's clients (and frameworks such as pipecat, which only allow OpenAI's names)
send ``alloy``, ``marin``...; each maps to a checkpoint speaker by the served
family's table (``FrontEnd.openai_voices``: each family knows its own speakers). A
name whose speaker the checkpoint lacks falls back to the checkpoint's first
speaker. ``--voice-alias NAME=SPEAKER`` adds or overrides an entry. Names match
case-insensitively.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from omnistage.entrypoints.openai.common.errors import quoted


class UnknownVoice(ValueError):
    """The name is neither a speaker of the checkpoint nor an alias of one."""


class VoiceBook:
    def __init__(self, speakers: Sequence[str], openai_voices: Mapping[str, str] = {},  # noqa: B006 - read only
                 aliases: Mapping[str, str] = {}, default: str = "") -> None:  # noqa: B006
        self.speakers = tuple(speakers)
        self._default = default
        by_key = {s.lower(): s for s in self.speakers}
        self._by_key = dict(by_key)
        for name, target in {**openai_voices, **{k.lower(): v for k, v in aliases.items()}}.items():
            speaker = by_key.get(target.lower())
            if speaker is None and name in {k.lower() for k in aliases}:
                raise ValueError(f"--voice-alias {name}={target}: the checkpoint has no speaker {target!r} "
                                 f"(it has: {', '.join(self.speakers) or 'none'})")
            if speaker is None and self.speakers:
                speaker = self.speakers[0]
            if speaker is not None and name.lower() not in by_key:
                self._by_key[name.lower()] = speaker

    @property
    def default(self) -> str:
        """The family's default speaker, else the first ("" for a model without speakers)."""
        return self._default or (self.speakers[0] if self.speakers else "")

    @property
    def names(self) -> tuple[str, ...]:
        """Every accepted name: the speakers, then the aliases."""
        return self.speakers + tuple(k for k in self._by_key if k not in {s.lower() for s in self.speakers})

    def resolve(self, name: str | None) -> str:
        """The checkpoint's speaker for ``name`` (None: the default voice); ``UnknownVoice`` otherwise."""
        if name is None:
            return self.default
        speaker = self._by_key.get(name.strip().lower())
        if speaker is None:
            raise UnknownVoice(f"unknown voice {quoted(name)}; this model has: {', '.join(self.names) or 'none'}")
        return speaker
