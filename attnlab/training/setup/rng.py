"""A run's own random stream: dropout and every other draw of a training step come from the
trainer's RNG state, swapped in around `fit` and back out after, so several runs in one process
(a seed sweep) do not disturb each other, and a checkpoint's RNG state resumes the same masks."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


class RunRandom:
    """The CPU (and, on a GPU, the device's) RNG state of one run."""

    def __init__(self, device: torch.device):
        self.device = device
        self.state = self.now()

    def now(self) -> dict[str, torch.Tensor]:
        """The process's current RNG states."""
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def take_current(self) -> None:
        """Adopt the process's current states (a checkpoint just set them)."""
        self.state = self.now()

    @contextmanager
    def own(self) -> Iterator[None]:
        """Run the block on this run's RNG state, then put the caller's back."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.state["cpu"])
            if "cuda" in self.state:
                torch.cuda.set_rng_state(self.state["cuda"], self.device)
            try:
                yield
            finally:
                self.state = self.now()
