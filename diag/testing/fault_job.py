"""One rank of a small data-parallel CPU job over gloo that injects one fault, for ``diag.testing.faults``.

Started once per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) as
``python fault_job.py TRACE_DIR`` with the scenario in the environment:
  FAULT_KIND     one of KINDS below
  FAULT_WHERE    where it strikes: data (the loader), forward, backward (inside autograd), optimizer (its
                 step), collective (an all_reduce in the forward, as tensor parallelism has), between (after
                 a step, outside diag.step: an evaluation or checkpoint hook; the plain loops only)
  FAULT_RANK     the rank that misbehaves
  FAULT_STEP     the step where it starts (0: before any step completed)
  FAULT_SHAPE    how the user's script is written around the loop: SHAPES below
  FAULT_COMPUTE  sleep (time.sleep stands in for a GPU's work) or matmul (real CPU work of a fixed size,
                 which a busy neighbour slows down)
  FAULT_ATTEMPT  0, or 1 for the restart of an elastic job (no fault; the same trace directory)
  FAULT_PG_TIMEOUT_S, FAULT_HANG_THRESHOLD_S, FAULT_STEPS
The bad rank writes ``TRACE_DIR/fault_at.json`` (wall-clock time of the injection) when the fault starts, and
``TRACE_DIR/ready`` where the driver must act (SIGSTOP, SIGKILL).
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import diag

KINDS = (
    "healthy",
    "straggler",  # persistent: extra work at the strike point every step from FAULT_STEP on
    "intermittent",  # a long spike every SPIKE_EVERY steps
    "memory",  # memory kept at the strike point every step (a leak)
    "exception",  # raises once
    "hang",  # works past the collective timeout, then goes on; in the data loader: never answers; in the
    # collective: enters it first and is frozen there by the driver (every rank entered, none completed)
    "frozen",  # SIGSTOPped by the driver at the strike point, SIGCONTed after the others' timeout
    "sigkill",  # SIGKILLed by the driver at the strike point
    "desync_op",  # collective only: all_gather where the others all_reduce
    "desync_shape",  # collective only: 4x3 where the others pass the 12 values as always (equal bytes)
    "desync_dtype",  # collective only: float64 where the others pass float32
    "cross_group",  # collective only: the bad rank and its partner enter two side groups in opposite orders
    "preempted",  # a healthy job whose every rank gets SIGTERM mid-run (the driver)
)
WHERES = ("data", "forward", "backward", "optimizer", "collective", "between")
SHAPES = (
    "propagate",  # the exception leaves the script; diag.finish() is never called
    "caught_finish",  # try: loop  except Exception: print  then diag.finish()
    "finally",  # try: loop  finally: diag.finish()
    "sys_exit",  # except Exception: print; sys.exit(1)
    "log_continue",  # each step in try/except: log the error and go on (gives up after MAX_ERRORS in a row)
    "trainer",  # diag.Trainer(...).fit(loader)
    "fsdp2",  # the loop of "propagate" around a fully_shard model
    "elastic",  # "propagate", then the driver restarts every rank into the same directory (attempt 1)
    "lightning",  # Lightning's Trainer (DDP strategy) with diag's DiagCallback
    "hf_trainer",  # transformers' Trainer (DDP on gloo) with diag's DiagTrainerCallback
    "deepspeed",  # a DeepSpeed engine (ZeRO-1, DS_ACCELERATOR=cpu) in the loop of "propagate"
    "pipeline",  # one stage per rank under torch's Schedule1F1B, the loss all-reduced for logging each step
    "mesh",  # the loop of "propagate" on a dp x tp device mesh: tensor-parallel layers, gradients averaged over dp
)
FRAMEWORK_SHAPES = ("lightning", "hf_trainer", "deepspeed")
MAX_ERRORS = 3

STEPS = int(os.environ.get("FAULT_STEPS", "14"))
COMPUTE_S = 0.03  # sleep compute: a step's work, half in the forward, half in the backward
MATMUL_N = 256
MATMULS_PER_STEP = 48  # matmul compute: ~30 ms on an idle core (OMP_NUM_THREADS=1), half forward, half backward
STRAGGLE_SHARE = 1.5  # a persistent straggler's extra work, as a share of a step's
SPIKE_S = 0.3  # an intermittent straggler's extra work, every SPIKE_EVERY steps: its time on an idle core
SPIKE_EVERY = 4
LEAK_BYTES_PER_STEP = 4 * 2**20


def env(name: str, default: str) -> str:
    return os.environ.get(name, default)


KIND = env("FAULT_KIND", "healthy")
WHERE = env("FAULT_WHERE", "forward")
BAD_RANK = int(env("FAULT_RANK", "1"))
BAD_STEP = int(env("FAULT_STEP", "3"))
SHAPE = env("FAULT_SHAPE", "propagate")
COMPUTE = env("FAULT_COMPUTE", "sleep")
ATTEMPT = int(env("FAULT_ATTEMPT", "0"))
PG_TIMEOUT_S = float(env("FAULT_PG_TIMEOUT_S", "6"))
# until the first batch: building the model and a framework's wrapping of it (DDP checks every rank's parameter
# shapes in a collective) can put one rank seconds behind another on a loaded box, which is no fault of the job
STARTUP_TIMEOUT_S = 120.0
TP = 2  # the mesh shape's tensor-parallel degree
HANG_THRESHOLD_S = float(env("FAULT_HANG_THRESHOLD_S", "2"))
TRACE_DIR = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
_MATRIX = torch.randn(MATMUL_N, MATMUL_N)
_LEAKED: list = []
_COUNTS = dict.fromkeys(WHERES, 0)  # calls so far at each strike point: its step index
_TIMED_GROUPS: list = []  # the mesh shape's dimension groups, besides the default group
_ARMED = [False]


def arm_timeouts() -> None:
    """Give every group the job's collective timeout (PG_TIMEOUT_S), once: from the first batch on, where the
    faults strike. DeviceMesh's groups would otherwise keep torch's default (30 minutes for gloo)."""
    if _ARMED[0]:
        return
    _ARMED[0] = True
    from torch.distributed.distributed_c10d import _set_pg_timeout  # torch's own way to change it in flight

    for group in (None, *_TIMED_GROUPS):
        _set_pg_timeout(datetime.timedelta(seconds=PG_TIMEOUT_S), group)


def mark(name: str) -> None:
    """Tell the driver when the fault started (and where it must act), atomically."""
    tmp = TRACE_DIR / f".{name}.tmp"
    tmp.write_text(json.dumps({"time_s": time.time(), "pid": os.getpid()}))
    tmp.replace(TRACE_DIR / name)


def work(share: float) -> None:
    """``share`` of one step's compute: a sleep, or a fixed number of matmuls (which take longer when the
    cores are busy, as real work does)."""
    if COMPUTE == "sleep":
        time.sleep(COMPUTE_S * share)
        return
    for _ in range(max(1, round(MATMULS_PER_STEP * share))):
        torch.mm(_MATRIX, _MATRIX)


def work_for(seconds: float) -> None:
    """Busy for ``seconds`` of wall time: sleeping, or computing."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if COMPUTE == "sleep":
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        else:
            torch.mm(_MATRIX, _MATRIX)


def strike(where: str) -> None:
    """Called at every strike point of every rank: the bad rank does its fault here when it is time."""
    step = _COUNTS[where]
    _COUNTS[where] += 1
    if ATTEMPT or dist.get_rank() != BAD_RANK or where != WHERE or step < BAD_STEP or KIND == "healthy":
        return
    first = step == BAD_STEP
    if first and KIND not in ("preempted",):
        mark("fault_at.json")
    if KIND == "straggler":
        work(STRAGGLE_SHARE) if where != "collective" else work_for(0.04)
    elif KIND == "intermittent" and (step - BAD_STEP) % SPIKE_EVERY == 0:
        # a fixed amount of work, as a periodic extra computation is: a spike of wall time spent mostly waiting
        # for a core (a loop until a deadline, on a loaded box) is what the host's preemption of a rank looks like
        work(SPIKE_S / COMPUTE_S)
    elif KIND == "memory":
        _LEAKED.append(torch.ones(LEAK_BYTES_PER_STEP // 4))  # kept forever, as a leak is
    elif first and KIND == "exception":
        raise RuntimeError(f"injected fault in {where}: CUDA error: an illegal memory access was encountered")
    elif first and KIND == "hang" and where == "data":
        threading.Event().wait()  # a data loader worker that never answers
    elif first and KIND == "hang" and where != "collective":
        work_for(PG_TIMEOUT_S + 4)  # arrives after the others have timed out
    elif first and KIND in ("frozen", "sigkill") and where != "collective":
        mark("ready")
        time.sleep(3600 if KIND == "sigkill" else PG_TIMEOUT_S + 6)  # the driver stops or kills it here


class Work(torch.autograd.Function):
    """Half of a step's compute in the forward, half in the backward, where the backward faults strike."""

    @staticmethod
    def forward(ctx, x):
        work(0.5)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        strike("backward")
        work(0.5)
        return grad


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(64, 128)
        self.second = torch.nn.Linear(128, 64)

    def forward(self, x):
        strike("forward")
        hidden = Work.apply(torch.relu(self.first(x)))
        out = self.second(hidden)
        sync_activations(out)
        return out


def sync_activations(out: torch.Tensor) -> None:
    """An all_reduce in the forward (a summary of the activations, as tensor parallelism reduces them): the
    collective where the collective faults strike."""
    rank, step = dist.get_rank(), _COUNTS["collective"]
    strike("collective")
    summary = out.detach()[:1, :12].reshape(12).clone()
    if ATTEMPT or step != BAD_STEP or WHERE != "collective":
        dist.all_reduce(summary)
        return
    bad = rank == BAD_RANK
    if KIND in ("hang", "frozen", "sigkill"):
        if bad:
            mark("ready")  # the driver freezes or kills this process inside the all_reduce below
        else:
            time.sleep(2.0)  # the bad rank is first into the collective
        dist.all_reduce(summary)
    elif KIND == "desync_op" and bad:
        dist.all_gather([torch.empty(12) for _ in range(dist.get_world_size())], summary)
    elif KIND == "desync_shape":
        dist.all_reduce(summary.reshape(4, 3) if bad else summary)
    elif KIND == "desync_dtype":
        dist.all_reduce(summary.double() if bad else summary)
    elif KIND == "cross_group":
        first, second = SIDE_GROUPS
        if bad:
            dist.barrier(group=first)
            dist.barrier(group=second)
        elif rank == partner_of(BAD_RANK):
            dist.barrier(group=second)
            dist.barrier(group=first)
        dist.all_reduce(summary)
    else:
        dist.all_reduce(summary)


class StrikingSGD(torch.optim.SGD):
    def step(self, closure=None):
        loss = None
        if closure is not None:  # Lightning runs the forward and backward in the closure: before the update
            with torch.enable_grad():
                loss = closure()
        strike("optimizer")
        super().step()
        return loss


class Batches(torch.utils.data.IterableDataset):
    def __iter__(self):
        for _ in range(STEPS):
            yield batch_of_step()


def batch_of_step() -> tuple[torch.Tensor, torch.Tensor]:
    arm_timeouts()
    strike("data")
    x = torch.randn(16, 64)
    return x, x.flip(1)


class BatchRows(torch.utils.data.Dataset):
    """For the HF Trainer (its sampler shards a map-style dataset over the ranks): each item a whole batch."""

    def __len__(self):
        return STEPS * dist.get_world_size()

    def __getitem__(self, index):
        x, y = batch_of_step()
        return {"x": x, "y": y}


SIDE_GROUPS: tuple = ()


def partner_of(rank: int) -> int:
    return (rank + 1) % int(os.environ["WORLD_SIZE"])


def build_model(world_size: int):
    model = Net()
    if SHAPE in FRAMEWORK_SHAPES:  # the framework wraps it (DDP) itself
        return model
    if SHAPE == "mesh":
        return build_mesh_model(model, world_size)
    if SHAPE == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world_size,))
        fully_shard(model.first, mesh=mesh)
        fully_shard(model.second, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def build_mesh_model(model: Net, world_size: int) -> Net:
    """Net on a (world/TP) x TP mesh: its first layer column-parallel, its second row-parallel (an all_reduce
    in the tp group in every forward, where a tp peer waits for a slow rank), as torchtitan lays out a block."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size // TP, TP), mesh_dim_names=("dp", "tp"))
    _TIMED_GROUPS.extend((mesh.get_group("dp"), mesh.get_group("tp")))
    model.dp_group = mesh.get_group("dp")
    return parallelize_module(model, mesh["tp"], {"first": ColwiseParallel(), "second": RowwiseParallel()})


def average_over_dp(model) -> None:
    """The mesh shape's data parallelism: each gradient shard averaged over the rank's dp group."""
    for param in model.parameters():
        grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
        dist.all_reduce(grad, group=model.dp_group)
        grad /= model.dp_group.size()


def loss_of(out, target):
    return torch.nn.functional.mse_loss(out, target)


def one_step(model, optimizer, batch) -> None:
    x, target = batch
    with diag.phase("forward"):
        loss = loss_of(model(x), target)
    loss.backward()
    if SHAPE == "mesh":
        average_over_dp(model)
    optimizer.step()
    optimizer.zero_grad()
    if KIND == "preempted" and not ATTEMPT and _COUNTS["forward"] > BAD_STEP:
        if _COUNTS["forward"] == BAD_STEP + 1 and dist.get_rank() == BAD_RANK:
            mark("ready")
        time.sleep(0.2)  # still training, healthy, when the SIGTERM comes


def train(model, optimizer) -> None:
    for batch in diag.wrap_loader(Batches()):
        with diag.step():
            one_step(model, optimizer, batch)
        strike("between")  # the user's own work between steps (evaluation, a checkpoint), outside any step


def train_logging_errors(model, optimizer) -> None:
    errors = 0
    for step, batch in enumerate(diag.wrap_loader(Batches())):
        try:
            with diag.step():
                one_step(model, optimizer, batch)
            errors = 0
        except Exception as exc:  # what many scripts do: log it, go on with the next batch
            print(f"step {step} failed: {exc}", file=sys.stderr, flush=True)
            optimizer.zero_grad()
            errors += 1
            if errors >= MAX_ERRORS:
                print("giving up", file=sys.stderr, flush=True)
                return


def run_shape(model, optimizer) -> None:
    if SHAPE in ("propagate", "fsdp2", "elastic", "mesh"):
        train(model, optimizer)
        diag.finish()
    elif SHAPE == "caught_finish":
        try:
            train(model, optimizer)
        except Exception as exc:
            print(f"training failed: {exc}", file=sys.stderr, flush=True)
        diag.finish()
    elif SHAPE == "finally":
        try:
            train(model, optimizer)
        finally:
            diag.finish()
    elif SHAPE == "sys_exit":
        try:
            train(model, optimizer)
        except Exception as exc:
            print(f"training failed: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)
        diag.finish()
    elif SHAPE == "log_continue":
        train_logging_errors(model, optimizer)
        diag.finish()
    else:
        raise SystemExit(f"unknown FAULT_SHAPE {SHAPE!r}; known: {', '.join(SHAPES)}")


def run_lightning(model, options: dict) -> None:
    """Lightning's Trainer joining this job's process group (as under torchrun), with DiagCallback, as
    docs/integrations.md says; Lightning reports an exception to its callbacks and raises it again."""
    import warnings

    from lightning.pytorch import LightningModule, Trainer

    from diag.integrations.lightning import DiagCallback

    warnings.filterwarnings("ignore", module="lightning")  # its advice about num_workers and logging

    class Module(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, batch_idx):
            x, target = batch
            return loss_of(self.net(x), target)

        def configure_optimizers(self):
            return StrikingSGD(self.parameters(), lr=0.01)

    trainer = Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy="ddp",
        max_steps=STEPS,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DiagCallback(str(TRACE_DIR), **options)],
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(Batches(), batch_size=None))


def run_hf_trainer(model, options: dict) -> None:
    """transformers' Trainer (DDP on gloo, joining this job's process group) with DiagTrainerCallback."""
    from transformers import Trainer, TrainingArguments

    from diag.integrations.huggingface import DiagTrainerCallback

    class Regression(torch.nn.Module):  # a transformers-style model: keyword inputs, a dict with the loss out
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, y=None):
            out = self.net(x.squeeze(0))
            return {"loss": loss_of(out, y.squeeze(0)), "logits": out}

    training = TrainingArguments(
        output_dir=str(TRACE_DIR / "hf_output"),
        per_device_train_batch_size=1,  # one item is a whole batch
        max_steps=STEPS,
        learning_rate=0.01,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        logging_strategy="no",
    )
    net = Regression()
    trainer = Trainer(
        model=net,
        args=training,
        train_dataset=BatchRows(),
        optimizers=(StrikingSGD(net.parameters(), lr=0.01), None),
        callbacks=[DiagTrainerCallback(str(TRACE_DIR), **options)],
    )
    trainer.train()


def run_deepspeed(model, options: dict) -> None:
    """A DeepSpeed engine with ZeRO stage 1 over this job's own optimizer, in a plain loop, as
    docs/frameworks.md says: diag.instrument(engine, optimizer)."""
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = StrikingSGD(model.parameters(), lr=0.01)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    diag.init(TRACE_DIR, **options)
    diag.instrument(engine, optimizer)
    for x, target in diag.wrap_loader(Batches()):
        with diag.step():
            with diag.phase("forward"):
                loss = loss_of(engine(x), target)
            engine.backward(loss)
            engine.step()
    diag.finish()


class StageWork(torch.autograd.Function):
    """One micro-batch's share of a stage's compute in the forward and in the backward; the backward faults
    strike in a step's first micro-batch backward."""

    @staticmethod
    def forward(ctx, x):
        work(0.5 / pipeline_microbatches())
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        strike_once_per_step("backward")
        work(0.5 / pipeline_microbatches())
        return grad


class Stage(torch.nn.Module):
    """A pipeline stage: one rank's layer; the forward faults strike in a step's first micro-batch."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        strike_once_per_step("forward")
        return StageWork.apply(torch.relu(self.linear(x)))


_PIPELINE_STEP = [0]  # the step the pipeline's loop is in
_STRUCK_IN_STEP: dict[str, int] = {}


def strike_once_per_step(where: str) -> None:
    """A schedule runs a stage's forward and backward once per micro-batch (and the forward once more to infer
    shapes): strike at the first of each step, so that a strike's index is the step's."""
    if _STRUCK_IN_STEP.get(where) != _PIPELINE_STEP[0]:
        _STRUCK_IN_STEP[where] = _PIPELINE_STEP[0]
        strike(where)


def pipeline_microbatches() -> int:
    return max(4, dist.get_world_size())  # 1F1B needs at least as many micro-batches as stages


def run_pipeline(options: dict) -> None:
    """Pipeline parallelism as torch.distributed.pipelining runs it: rank r holds stage r of a Schedule1F1B; the
    first stage reads the batch, the last computes the loss; then the stages' loss summary is all-reduced for
    the log (where the collective faults strike), and each stage steps its own optimizer."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, world_size = dist.get_rank(), dist.get_world_size()
    stage = Stage()
    schedule = Schedule1F1B(
        PipelineStage(stage, rank, world_size, torch.device("cpu")), pipeline_microbatches(), loss_fn=loss_of
    )
    optimizer = StrikingSGD(stage.parameters(), lr=0.01)
    diag.init(TRACE_DIR, **options)
    diag.instrument(schedule, optimizer)
    for step, (x, target) in enumerate(diag.wrap_loader(Batches())):
        _PIPELINE_STEP[0] = step
        with diag.step():
            schedule.step(*((x,) if rank == 0 else ()), target=target if rank == world_size - 1 else None)
            sync_activations(stage.linear.weight.detach()[:1])
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()


def start_together() -> None:
    """Import what the shape needs, then wait until every rank has (a file barrier, which has no timeout): on
    a loaded machine importing a framework can take one rank far longer than another, which is no fault, and
    would otherwise run into the collective timeout of the first collective."""
    if SHAPE == "lightning":
        import lightning.pytorch  # noqa: F401
    elif SHAPE == "hf_trainer":
        import transformers  # noqa: F401
    elif SHAPE == "deepspeed":
        import deepspeed  # noqa: F401
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    TRACE_DIR.parent.mkdir(parents=True, exist_ok=True)
    (TRACE_DIR.parent / f".started-{ATTEMPT}-{rank}").touch()
    while not all((TRACE_DIR.parent / f".started-{ATTEMPT}-{r}").exists() for r in range(world_size)):
        time.sleep(0.05)


def main() -> None:
    global SIDE_GROUPS
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a stuck rank is: kill -USR1 PID
    os.environ.setdefault("TORCHELASTIC_RUN_ID", "diag-faults")  # frameworks: join this process group, spawn none
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    start_together()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same weights on every rank
    # a pipeline's sends and receives keep the timeout their group was made with (gloo's pairs take it when they
    # connect; _set_pg_timeout changes the collectives'), and it builds no DDP: the job's timeout from the start
    startup_timeout_s = PG_TIMEOUT_S if SHAPE == "pipeline" else STARTUP_TIMEOUT_S
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=startup_timeout_s))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if KIND == "cross_group":  # every rank must create every group, in the same order
        pair = sorted({BAD_RANK, partner_of(BAD_RANK)})
        SIDE_GROUPS = (dist.new_group(pair), dist.new_group(pair))
    options = {"telemetry": False, "hang_threshold_s": HANG_THRESHOLD_S, "heartbeat_interval_s": 0.5}
    if SHAPE == "pipeline":  # its own stage per rank, no data-parallel model
        run_pipeline(options)
        dist.destroy_process_group()
        return
    model = build_model(world_size)
    if SHAPE not in FRAMEWORK_SHAPES:  # built: the job's timeout before diag.init records it
        arm_timeouts()
    optimizer = StrikingSGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    if SHAPE == "trainer":
        trainer = diag.Trainer(model, optimizer, loss_of, str(TRACE_DIR), session_options=options)
        trainer.fit(Batches())
    elif SHAPE == "lightning":
        run_lightning(model, options)
    elif SHAPE == "hf_trainer":
        run_hf_trainer(model, options)
    elif SHAPE == "deepspeed":
        run_deepspeed(model, options)
    else:
        diag.init(TRACE_DIR, **options)
        diag.instrument(model, optimizer)
        run_shape(model, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
