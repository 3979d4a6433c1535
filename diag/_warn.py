"""One warning per problem: capture must tell the user once and then keep quiet."""

from __future__ import annotations

import threading
import warnings

_seen: set[str] = set()
_lock = threading.Lock()


class DiagWarning(RuntimeWarning):
    """Capture degraded or skipped something; the training job itself is unaffected."""


def warn_once(key: str, message: str) -> bool:
    """Emit ``message`` the first time ``key`` is seen in this process. Returns whether it was emitted."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    warnings.warn(f"diag: {message}", DiagWarning, stacklevel=3)
    return True


def reset_for_tests() -> None:
    with _lock:
        _seen.clear()
