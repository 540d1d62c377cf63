"""Which rows each step trains on, for every run (the demo's rows and a user's alike)."""

from __future__ import annotations

import torch

from draslice.errors import InvalidParameter


class BatchSampler:
    """Draws batches of row indices from ``n_rows`` rows with its own seeded generator.

    Its whole position in the data is the generator's state, so a checkpoint that stores
    :meth:`state_dict` resumes with exactly the batches an uninterrupted run would draw.
    """

    def __init__(self, n_rows: int, batch_size: int, seed: int) -> None:
        if batch_size <= 0:
            raise InvalidParameter("batch_size", batch_size, "must be >= 1")
        if batch_size > n_rows:
            raise InvalidParameter(
                "batch_size", batch_size, f"must be at most the number of examples, {n_rows}"
            )
        self.n_rows = n_rows
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        return torch.randperm(self.n_rows, generator=self.gen)[: self.batch_size]

    def state_dict(self) -> dict:
        return {"generator": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["generator"])
