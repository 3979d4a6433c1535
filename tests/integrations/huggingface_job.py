"""A real Hugging Face ``Trainer.train`` (CPU, tiny model, nothing downloaded) captured by
DiagTrainerCallback: ``train`` runs it in this process; run as a script it is one rank of a job started with
torchrun's variables and writes what the Trainer says it did to ``TRACE_DIR/truth/rankN.json``.

usage: huggingface_job.py TRACE_DIR MAX_STEPS ACCUMULATE
"""

import json
import os
import sys

import torch
from transformers import Trainer, TrainingArguments

import diag
from diag.integrations.huggingface import DiagTrainerCallback

BATCH, SEQ = 4, 12


class TokenRegressor(torch.nn.Module):
    """Like a transformers model: keyword inputs, a dict with ``loss`` out."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.head = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids).mean(dim=1)).squeeze(-1)
        loss = torch.nn.functional.mse_loss(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (n, SEQ), generator=generator)
        self.labels = self.ids.float().mean(dim=1) / 100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def train(trace_dir, max_steps: int, accumulate: int = 1, eval_every: int | None = None, **options) -> Trainer:
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=os.path.join(trace_dir, "hf_output"),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=accumulate,
        max_steps=max_steps,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="steps" if eval_every else "no",
        eval_steps=eval_every,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
    )
    trainer = Trainer(
        model=TokenRegressor(),
        args=args,
        train_dataset=Tokens(256),
        eval_dataset=Tokens(64) if eval_every else None,
        callbacks=[DiagTrainerCallback(trace_dir, telemetry=False, **options)],
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    trace_dir, max_steps, accumulate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    trainer = train(trace_dir, max_steps, accumulate, flops_per_step=1e6)
    truth = {
        "global_step": trainer.state.global_step,
        "world_size": trainer.args.world_size,
        "param_bytes": sum(p.numel() * p.element_size() for p in trainer.model.parameters()),
        "session_closed": not diag.session().enabled,
    }
    os.makedirs(os.path.join(trace_dir, "truth"), exist_ok=True)
    with open(os.path.join(trace_dir, "truth", f"rank{trainer.args.process_index}.json"), "w") as f:
        json.dump(truth, f)
