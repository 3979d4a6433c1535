import os
import shutil
from pathlib import Path

import pytest

from tests.dashboard.fixtures import browser, serve, synthetic_run  # noqa: F401 - the dashboard tests' fixtures

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
INTEGRATION = REPO / "tests" / "integration"


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def requires_gpu(test):
    """Skipped without a CUDA GPU, and marked ``gpu`` so that ``pytest -m gpu`` runs exactly these on a GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU with CUDA")(test))


@pytest.fixture
def gpu_fixtures() -> Path:
    path = Path(os.environ.get("DIAG_SHARED_FIXTURES", SHARED_FIXTURES)) / "gpu-h100"
    if not path.is_dir():
        pytest.skip(f"shared GPU fixtures not found at {path}")
    return path


@pytest.fixture
def hta_fixtures() -> Path:
    """Real multi-GPU torch.profiler traces from Holistic Trace Analysis' test data (see its README.md)."""
    path = Path(os.environ.get("DIAG_SHARED_FIXTURES", SHARED_FIXTURES)) / "hta-public"
    if not path.is_dir():
        pytest.skip(f"shared HTA trace fixtures not found at {path}")
    return path


@pytest.fixture(autouse=True)
def _fresh_warnings():
    from diag._warn import reset_for_tests

    reset_for_tests()
    yield


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def pytest_collection_modifyitems(config, items):
    """Every test under tests/integration is ``slow``: ``-m "not slow"`` selects exactly tests/unit."""
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.slow)
