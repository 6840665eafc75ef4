"""A replica's signs of life as the orchestrator sees them, and when to restart it after it dies or hangs.

A process that is alive is not necessarily working: a replica that is
SIGSTOPped, deadlocked or wedged in a kernel still passes ``is_alive``. Two
signs are watched, each with its own bound:

* **Pulse** (``stall_timeout_s``, default ``DEFAULT_STALL_TIMEOUT_S`` = 8 s): a
  heartbeat thread of the replica (``replica.Pulse``) sends a ``Heartbeat``
  every ``HEARTBEAT_S`` whatever the engine is doing. A replica silent this
  long is stopped or gone (SIGSTOP freezes every thread, the pulse too), or
  its process is wedged outside Python. A long prefill cannot starve the pulse:
  the engine step runs on another thread, torch releases the GIL inside its
  kernels, and between bytecodes CPython hands the GIL over every
  ``sys.getswitchinterval()`` (5 ms), so the pulse thread waits milliseconds,
  not seconds. The default is eight heartbeat periods: a pulse late by 7 s would
  need one C call holding the GIL that long, which nothing in a replica's step
  does (a step's work is bounded by its token budget and runs in torch). The
  orchestrator checks every ``LIVENESS_EVERY_S`` (0.5 s) and stamps a message
  when it drains it (a busy orchestrator cannot make a replica look silent), so
  a stopped replica is seen within 8.5 s, under the 10 s a voice client bears.
* **Progress** (``step_timeout_s``, default ``DEFAULT_STEP_TIMEOUT_S`` = 300 s):
  each heartbeat carries the engine loop's pass count, which grows every pass
  (at least every ``IDLE_WAIT_S`` when idle). A count unchanged this long
  while the pulse beats means one step (or one input's handling) never ends: a
  deadlocked collective or kernel. This bound is long on purpose, so a long
  but legitimate step is never mistaken for a hang: the scheduler caps a step
  at ``max_num_batched_tokens`` (2048 by default) prompt tokens plus media
  encoders, seconds on a GPU and well under five minutes for the supported
  models even on a CPU; ``--stage-step-timeout`` raises it for slower hosts.

Either way the replica is declared stalled: its requests fail, it is killed
and restarted. Restarts back off (doubling up to a cap) and the backoff starts
over once a replica has stayed healthy for ``BACKOFF_RESET_S``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

HEARTBEAT_S = 1.0  # a replica's pulse thread reports this often
RESTART_BACKOFF_S = (0.5, 30.0)  # first wait before restarting a dead replica, and the cap as it doubles
BACKOFF_RESET_S = 60.0  # healthy this long: the next failure restarts after the first wait again
DEFAULT_STALL_TIMEOUT_S = 8.0  # no heartbeat this long: stopped or gone (a voice client notices in seconds)
DEFAULT_STEP_TIMEOUT_S = 300.0  # heartbeats but no engine pass this long: a step that never ends


@dataclass(frozen=True)
class StallBounds:
    """When a ready replica counts as hung: silent (no message at all) for ``silence_s``, or beating but with
    no engine pass finished for ``step_s``."""

    silence_s: float = DEFAULT_STALL_TIMEOUT_S
    step_s: float = DEFAULT_STEP_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.silence_s > HEARTBEAT_S:
            raise ValueError(f"the stage stall timeout must be longer than the {HEARTBEAT_S:g} s heartbeat, "
                             f"got {self.silence_s}")
        if not self.step_s >= self.silence_s:
            raise ValueError(f"the stage step timeout ({self.step_s:g} s) must be at least the stall timeout "
                             f"({self.silence_s:g} s)")


@dataclass
class Liveness:
    last_seen: float = field(default_factory=time.monotonic)  # its latest message (or its creation)
    last_progress: float = field(default_factory=time.monotonic)  # when its engine loop last finished a pass
    passes: int = -1  # the engine loop's pass count in its latest heartbeat
    healthy_since: float | None = None
    backoff: int = 0  # restarts since it was last healthy for BACKOFF_RESET_S

    def seen(self, now: float) -> None:
        self.last_seen = now

    def progressed(self, now: float) -> None:
        """Its engine loop produced output (a step's batch, or readiness)."""
        self.last_seen = self.last_progress = now

    def beat(self, now: float, passes: int) -> None:
        """A heartbeat: alive; and progressing if the pass count moved (a restart starts it over, hence ``!=``)."""
        self.last_seen = now
        if passes != self.passes:
            self.passes, self.last_progress = passes, now

    def became_healthy(self, now: float) -> None:
        self.healthy_since = self.last_seen = self.last_progress = now
        self.passes = -1

    def silent_for(self, now: float) -> float:
        return now - self.last_seen

    def stuck_for(self, now: float) -> float:
        return now - self.last_progress

    def hung(self, now: float, bounds: StallBounds) -> str:
        """Why it counts as hung now, naming the flag that bounds it; empty while it is fine."""
        if (silent := self.silent_for(now)) > bounds.silence_s:
            return f"stalled: no heartbeat for {silent:.1f} s (--stage-stall-timeout {bounds.silence_s:g} s)"
        if (stuck := self.stuck_for(now)) > bounds.step_s:
            return (f"stalled: one engine step has run for {stuck:.1f} s (--stage-step-timeout "
                    f"{bounds.step_s:g} s)")
        return ""

    def restart_delay(self, now: float) -> float:
        """How long to wait before restarting it, now that it is down."""
        if self.healthy_since is not None and now - self.healthy_since >= BACKOFF_RESET_S:
            self.backoff = 0
        self.healthy_since = None
        first, cap = RESTART_BACKOFF_S
        delay = min(first * 2 ** self.backoff, cap)
        self.backoff += 1
        return delay
