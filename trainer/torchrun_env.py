"""What torchrun told this process: its rank, the world size and its local rank.

Torch-free, so that ``draslice train`` can ask before it imports torch
(``input_checks.check_early``) and ``distributed`` asks the same function when it joins the
process group.
"""

from __future__ import annotations

import os

from draslice.errors import InvalidParameter


def launched() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun set them; (0, 1, 0) without torchrun."""
    env = os.environ
    try:
        return (int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")),
                int(env.get("LOCAL_RANK", "0")))
    except ValueError as err:
        raise InvalidParameter("RANK/WORLD_SIZE/LOCAL_RANK", str(err),
                               "must be integers (torchrun sets them)") from None
