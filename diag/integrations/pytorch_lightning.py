"""``DiagCallback`` for the older ``pytorch_lightning`` package name (a ``pytorch_lightning.Callback``:
``pytorch_lightning.Trainer`` accepts only those). The same callback as ``diag.integrations.lightning``."""

from __future__ import annotations

from diag.integrations._driver import missing_framework

try:
    from pytorch_lightning import Callback as _Callback
except ImportError:
    raise missing_framework("pytorch_lightning", "lightning") from None

from diag.integrations.lightning import DiagCallbackMixin


class DiagCallback(DiagCallbackMixin, _Callback):
    """A ``pytorch_lightning.Callback`` capturing the fit with diag; see ``diag.integrations.lightning``."""
