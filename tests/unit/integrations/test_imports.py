"""The frameworks stay optional: diag never imports them, and a missing one is an ImportError naming the
extra to install."""

import importlib
import re
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "framework_modules", "extra"),
    [
        ("diag.integrations.lightning", ["lightning", "lightning.pytorch", "pytorch_lightning"], "diag[lightning]"),
        ("diag.integrations.pytorch_lightning", ["pytorch_lightning"], "diag[lightning]"),
        ("diag.integrations.huggingface", ["transformers"], "diag[huggingface]"),
    ],
)
def test_missing_framework_names_the_extra(monkeypatch, module, framework_modules, extra):
    for name in framework_modules:
        monkeypatch.setitem(sys.modules, name, None)  # what an uninstalled package looks like to import
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=re.escape(f"pip install '{extra}'")) as raised:
        importlib.import_module(module)
    # quoted (zsh globs brackets), and what a checkout installs
    assert f"pip install '.[{extra.removeprefix('diag[')}'" in str(raised.value)


def test_pytorch_lightning_namespace_has_its_own_callback_class(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from diag.integrations.pytorch_lightning import DiagCallback

    assert isinstance(DiagCallback(tmp_path), pl.Callback)
