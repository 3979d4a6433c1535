"""The optional parts of diag and the packages each needs (pyproject.toml's extras).

``pip install diag`` is the analysis alone (``diag analyze``, ``triage``, ``compare``, ``export``,
``memory-plan``: pandas and pyarrow, no torch). Capture inside training needs ``diag[capture]`` (torch, NVML's
bindings), the dashboard and the HTML reports ``diag[dashboard]`` (dash, plotly, waitress). A part whose
packages are missing says which extra to install, once, instead of a traceback from deep inside."""

from __future__ import annotations

import importlib

EXTRA_MODULES = {
    "capture": ("torch",),  # NVML's bindings are optional at run time: no GPU, no NVML readings
    "dashboard": ("dash", "plotly", "waitress"),
    "html": ("plotly",),  # the HTML reports: part of the dashboard extra
}
EXTRA_OF = {"capture": "capture", "dashboard": "dashboard", "html": "dashboard"}


class MissingExtra(ImportError):
    """A part of diag was used whose packages are not installed; the message says what to install."""


def require(part: str, what: str) -> None:
    """Raise MissingExtra naming ``pip install 'diag[EXTRA]'`` if a package ``part`` needs is missing.
    ``what`` names what the user asked for ("diag dashboard", "--html")."""
    missing = []
    for module in EXTRA_MODULES[part]:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingExtra(
            f"{what} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"pip install 'diag[{EXTRA_OF[part]}]'"
        )
