"""A duplex model whose rows echo their input and whose step costs what the test's clock says."""

import torch

from omnistage.engine.duplex.base import DuplexStep


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class EchoModel:
    """Row state: the session's tag (its prompt) and the frames it heard; a step returns [tag, heard...]."""

    def __init__(self, clock: FakeClock, max_rows: int = 8, step_s: float = 0.01, per_row_s: float = 0.0) -> None:
        self.clock, self.step_s, self.per_row_s = clock, step_s, per_row_s
        self.tags: list[int] = []
        self.heard: list[list[int]] = []
        self._max = max_rows

    frame_s = 0.08

    @property
    def max_rows(self) -> int:
        return self._max

    @property
    def rows(self) -> int:
        return len(self.tags)

    def silence(self) -> torch.Tensor:
        return torch.tensor([-7, -7])

    def open(self, prompt: object | None) -> int:
        self.tags.append(int(prompt or 0))
        self.heard.append([])
        return len(self.tags) - 1

    def close(self, row: int) -> int | None:
        last = len(self.tags) - 1
        tag, heard = self.tags.pop(), self.heard.pop()
        if row == last:
            return None
        self.tags[row], self.heard[row] = tag, heard
        return last

    def step(self, user: torch.Tensor) -> DuplexStep:
        self.clock.now += self.step_s + self.per_row_s * len(self.tags)
        for row, frame in enumerate(user):
            self.heard[row].append(int(frame[0]))
        tags = torch.tensor(self.tags)
        return DuplexStep(tags, torch.stack([tags, user[:, 0]], dim=1), torch.ones(len(tags), dtype=torch.bool))
