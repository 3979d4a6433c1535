"""One rank of a small gloo job with capture on: ``python readiness_job.py TRACE_DIR`` with torchrun's variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and whatever hang settings the test puts in the environment."""

import datetime
import sys

import torch
import torch.distributed as dist

import diag

TIMEOUT_S = 45


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    diag.init(sys.argv[1], telemetry=False, watchdog=False)
    model = torch.nn.Linear(16, 16)
    diag.instrument(model)
    for _ in range(4):
        with diag.step():
            loss = model(torch.randn(8, 16)).square().mean()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
    diag.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
