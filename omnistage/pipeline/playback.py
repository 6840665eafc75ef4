"""The caller's player, as the orchestrator models it: it starts at the first audio and pauses when it runs dry.

Every figure is on one clock (``time.monotonic()`` in the pipeline; any clock in tests). The model is what chunk
sizing and code2wav's deadline order need to know: when the audio already delivered runs out (``play_end``), how
much is on its way (``in_flight_s``), and how long the player has stalled so far. It counts seconds, whatever the
family's frame rate (the codec edge converts its frames).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Playback:
    # When the player runs dry (it starts at the first audio and pauses whenever it ran dry); None until the
    # first audio reached the caller.
    play_end: float | None = None
    in_flight_s: float = 0.0  # audio sent to code2wav and not back yet
    stalls: int = 0  # times the player ran dry before more audio came
    stall_s: float = 0.0  # seconds it spent dry, waiting

    def sent(self, seconds: float) -> None:
        """New frames holding ``seconds`` of audio (context excluded) went to the codec stage."""
        self.in_flight_s += seconds

    def delivered(self, now: float, seconds: float) -> float:
        """``seconds`` of audio reached the caller at ``now``; a player that ran dry resumes then. Returns the
        stall this delivery ended (0 when the player had not run dry)."""
        stall = 0.0
        if self.play_end is not None and now > self.play_end:
            stall = now - self.play_end
            self.stalls += 1
            self.stall_s += stall
        self.play_end = max(now, self.play_end or now) + seconds
        self.in_flight_s = max(0.0, self.in_flight_s - seconds)
        return stall

    def buffered_s(self, now: float) -> float:
        """Audio the player holds at ``now`` (0 once it ran dry or before it started)."""
        return 0.0 if self.play_end is None else max(0.0, self.play_end - now)

    def deadline(self, now: float, startup_s: float = 1.0) -> float:
        """When this stream's player runs dry unless a chunk sent now arrives: the audio it holds, then the audio
        already on its way. A stream not yet playing cannot run dry; it is given ``startup_s`` of slack, so
        streams already playing and nearly out go first, yet new streams cannot starve. A player that already ran
        dry counts from ``now``: it stalls until the next chunk, and chasing its past deadline would make every
        stream late under overload (EDF's domino effect)."""
        start = now + startup_s if self.play_end is None else max(now, self.play_end)
        return start + self.in_flight_s
