"""``python -m diag.capture.options_doc > docs/capture-options.md``: the options of ``diag.init``, generated from
``CaptureConfig`` (a module of its own: ``import diag`` imports diag.capture.config, which ``-m`` would run twice)."""

from diag.capture.config import render_markdown

if __name__ == "__main__":
    print(render_markdown(), end="")
