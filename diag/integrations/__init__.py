"""Callbacks that capture a framework's training run with diag, without a loop of your own.

* ``diag.integrations.lightning.DiagCallback``: PyTorch Lightning (``pip install diag[lightning]``);
  ``diag.integrations.pytorch_lightning.DiagCallback`` for the older ``pytorch_lightning`` package;
* ``diag.integrations.huggingface.DiagTrainerCallback``: Hugging Face ``transformers.Trainer``
  (``pip install diag[huggingface]``).

Each does what ``diag.init`` + ``diag.instrument`` + ``diag.step`` + ``diag.finish`` do in a loop of your
own; see docs/integrations.md. Importing ``diag`` or this package imports neither framework.
"""
