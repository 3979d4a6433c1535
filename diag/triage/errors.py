"""How a rank's error reads: a failure of its own, or what a rank raises when a peer it waits for has failed."""

from __future__ import annotations

import re

TIMEOUT_PATTERN = re.compile(r"timed out|timeout", re.IGNORECASE)  # gloo's and NCCL's watchdog's wording
# what a rank raises when a peer it waits for has failed: gloo's and NCCL's timeouts, closed connections, and
# NCCL's errors of the transport ("NCCL error ... remote process exited or there was a network error")
COMMUNICATION_FAILURE_PATTERN = re.compile(
    TIMEOUT_PATTERN.pattern
    + r"|connection (?:closed|reset)|closed by peer|broken pipe|NCCL communicator was aborted"
    + r"|NCCL error|ncclRemoteError|ncclSystemError|remote process exited",
    re.IGNORECASE,
)


def is_own_error(text: str | None) -> bool:
    """An error the rank raised of its own (its code, its data, its memory), not a peer's failure reaching it."""
    return bool(text) and not COMMUNICATION_FAILURE_PATTERN.search(text)
