"""Where the device memory went, by category: parameters, gradients and optimizer state, as the bytes of the
tensors the instrumented model and optimizer hold on this rank's device.

Counted by storage, each once: a DDP gradient that is a view into its bucket, DeepSpeed's parameters that are
views into one flat buffer and FSDP2's padded local shards are counted as the memory the allocator gave them.
DTensors (FSDP2, tensor parallel) count their local shard; DeepSpeed ZeRO-3 parameters their partition
(``ds_tensor``). Tensors on another device (offloaded to CPU on a GPU run) are not this device's memory.

Walking every parameter costs ~1 us a tensor, so it is done at the first steps (lazy optimizer state appears
at the first update) and every ``MEASURE_EVERY_STEPS``; rows in between repeat the latest measurement, with
the step it was taken at. Gradients are measured when the step's backward ends (DDP's reduction and ZeRO's
partitioning are done by then); the rest at the step's end. What is left of a step's peak allocation is the
analysis's "activations and temporaries".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MEASURE_FIRST_STEPS = 3
MEASURE_EVERY_STEPS = 50
# DeepSpeed ZeRO optimizers keep reduced gradient partitions in these attributes (stage 1/2: a dict of lists,
# or one flat buffer with contiguous gradients; stage 3: one flat buffer), not in any parameter's .grad
_DEEPSPEED_GRADIENT_ATTRIBUTES = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer")


class MemoryCategories:
    """Bytes of parameters, gradients and optimizer state of the instrumented objects, on ``device``."""

    def __init__(self, device):
        self.device = device
        self.modules: list = []
        self.optimizers: list = []
        self.param_bytes: int | None = None
        self.grad_bytes: int | None = None
        self.optimizer_state_bytes: int | None = None
        self.measured_step: int | None = None
        self._grads_measured_at: int | None = None

    def add_module(self, module) -> None:
        if all(module is not known for known in self.modules):
            self.modules.append(module)

    def add_optimizer(self, optimizer) -> None:
        if all(optimizer is not known for known in self.optimizers):
            self.optimizers.append(optimizer)

    @property
    def tracking(self) -> bool:
        return bool(self.modules or self.optimizers)

    @staticmethod
    def due(step: int | None) -> bool:
        return step is not None and (step < MEASURE_FIRST_STEPS or step % MEASURE_EVERY_STEPS == 0)

    def on_backward_end(self, step: int | None) -> None:
        """At the end of each backward of a due step: the last one of the step leaves its gradients."""
        if self.tracking and self.due(step):
            try:
                self.grad_bytes = self.gradient_bytes()
                self._grads_measured_at = step
            except Exception as exc:
                self._give_up(exc)

    def on_step_end(self, step: int | None) -> None:
        if not (self.tracking and self.due(step)):
            return
        try:
            self.measure(step, gradients=self._grads_measured_at != step)
        except Exception as exc:
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        """A tensor layout this walk does not understand: one warning, and no categories from here on (the
        memory rows go on without them)."""
        from diag._warn import warn_once

        warn_once("memory-categories", f"cannot count memory by category ({exc!r}); the categories stop")
        self.modules, self.optimizers = [], []
        self.measured_step = None

    def measure(self, step: int | None, gradients: bool = True) -> None:
        """Everything now (also at an OOM, whatever the step)."""
        model_storages: set[int] = set()
        self.param_bytes = self._bytes(self._parameters(), model_storages)
        self.optimizer_state_bytes = self.optimizer_bytes(model_storages)
        if gradients:
            self.grad_bytes = self.gradient_bytes()
        self.measured_step = step

    # -- the three counts --------------------------------------------------------------------------------------
    def parameter_bytes(self) -> int:
        return self._bytes(self._parameters(), set())

    def gradient_bytes(self) -> int:
        grads = [getattr(p, "grad", None) for p in (*self._parameters(), *self._optimizer_parameters())]
        for optimizer in self.optimizers:
            for name in _DEEPSPEED_GRADIENT_ATTRIBUTES:
                grads.extend(_tensors_in(getattr(optimizer, name, None)))
        return self._bytes(grads, set())

    def optimizer_bytes(self, model_storages: set[int] | None = None) -> int:
        """``optimizer.state``'s tensors and master weights: the optimizer's parameters whose storage is not a
        model parameter's (DeepSpeed's fp32 partitions, any fp32 copy of a 16-bit model). ``model_storages``:
        the parameters' storages, when the caller has just walked them."""
        if model_storages is None:
            model_storages = set()
            self._bytes(self._parameters(), model_storages)
        seen = set(model_storages)
        total = self._bytes(self._optimizer_parameters(), seen)
        for optimizer in _with_held_optimizers(self.optimizers):
            state = getattr(optimizer, "state", None)
            if isinstance(state, dict):
                total += self._bytes((v for s in state.values() for v in _tensors_in(s)), seen)
        return total

    # -- walking ----------------------------------------------------------------------------------------------
    def _parameters(self) -> list:
        if self.modules:  # a wrapper and the module it wraps (DDP, an engine) list the same parameters: once
            return list({id(p): p for m in self.modules for p in m.parameters()}.values())
        return list(self._optimizer_parameters())  # only an optimizer instrumented: its parameters are the model's

    def _optimizer_parameters(self) -> Iterator:
        for optimizer in self.optimizers:
            for group in getattr(optimizer, "param_groups", None) or ():
                yield from group.get("params", ()) if isinstance(group, dict) else ()

    def _device_index(self) -> int:
        """The device as ``Tensor.get_device()`` numbers it (-1: CPU), an integer compared per tensor."""
        if self.device.type == "cpu":
            return -1
        if self.device.index is None:
            import torch

            return torch.cuda.current_device()
        return self.device.index

    def _bytes(self, tensors: Iterable, seen: set[int]) -> int:
        """Bytes of the distinct storages of ``tensors`` on this device not in ``seen`` (which gains them)."""
        import torch

        total = 0
        plain = (torch.Tensor, torch.nn.Parameter)
        device = self._device_index()
        for tensor in tensors:
            if type(tensor) not in plain:  # a subclass (DTensor) or a parameter with a partition (ZeRO-3)
                if not isinstance(tensor, torch.Tensor):
                    continue
                tensor = _local(tensor)
            elif tensor.__dict__:  # attributes set on the parameter: DeepSpeed's ds_tensor among them
                tensor = _local(tensor)
            if tensor.get_device() != device:
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key in seen:
                continue
            if key:
                seen.add(key)
            total += storage.nbytes()
        return total


def _local(tensor):
    """The tensor this rank holds: a DTensor's local shard, a ZeRO-3 parameter's partition."""
    partition = getattr(tensor, "ds_tensor", None)
    if partition is not None:
        return partition
    local = getattr(tensor, "_local_tensor", None)  # DTensor: to_local() without building autograd edges
    return local if local is not None else tensor


def held_optimizers(optimizer) -> list:
    """The optimizers a container of optimizers holds (torchtitan's ``OptimizersContainer``: a
    ``torch.optim.Optimizer`` over all the parameters whose own ``state`` stays empty, each optimizer it holds in
    ``.optimizers`` keeping its parameters' state); [] for an ordinary optimizer."""
    held = getattr(optimizer, "optimizers", None)
    if not isinstance(held, (list, tuple)):
        return []
    return [o for o in held if o is not optimizer and isinstance(getattr(o, "state", None), dict)]


def _with_held_optimizers(optimizers: list) -> Iterator:
    for optimizer in optimizers:
        yield optimizer
        yield from held_optimizers(optimizer)


def _tensors_in(value, depth: int = 0) -> Iterator:
    """Tensors in a value of optimizer state: a tensor, or dicts and lists of them (a few levels deep)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item, depth + 1)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item, depth + 1)


def describe_model(modules: list, optimizers: list) -> dict:
    """What ``diag memory-plan`` needs to predict this run's memory (manifest ``memory_model``): the model's
    parameters (all of them when the sharding says, else this rank's), their dtype, the optimizer, whether it
    keeps master weights, the sharding and over how many ranks."""
    import torch

    params = list({id(p): p for m in modules for p in m.parameters()}.values())  # a wrapper and its module: once
    local_count = sum(_local(p).numel() for p in params)
    global_count = _global_count(params)
    by_dtype: dict[str, int] = {}
    for p in params:
        by_dtype[str(p.dtype).removeprefix("torch.")] = by_dtype.get(str(p.dtype).removeprefix("torch."), 0) + p.numel()
    sharding, stage, degree = _sharding(modules, optimizers)
    inner = [getattr(o, "optimizer", o) for o in optimizers]  # Accelerate's wrapper: the optimizer it holds
    inner = [(held_optimizers(o) or [o])[0] for o in inner]  # a container of optimizers: the first it holds
    masters = any(getattr(o, "single_partition_of_fp32_groups", None) for o in optimizers) or any(
        getattr(o, "fp32_partitioned_groups_flat", None) for o in optimizers
    )
    return {
        "params": global_count,
        "params_local": local_count,
        "param_dtype": max(by_dtype, key=by_dtype.get) if by_dtype else None,
        "optimizer": type(inner[0]).__name__ if inner and isinstance(inner[0], torch.optim.Optimizer) else None,
        "master_weights": bool(masters),
        "sharding": sharding,
        "zero_stage": stage,
        "shard_degree": degree,
    }


def _global_count(params: list) -> int | None:
    """Parameters of the whole model when each parameter knows its full size (DTensor, ZeRO-3, FSDP1's flat
    parameters) or none is sharded; None when some are plain local shards (Megatron tensor parallel)."""
    total = 0
    for p in params:
        if hasattr(p, "ds_numel"):
            total += int(p.ds_numel)
        elif hasattr(p, "_unpadded_unsharded_size"):
            total += int(p._unpadded_unsharded_size.numel())
        elif getattr(p, "tensor_model_parallel", False):  # megatron-core's shards say what they are, not the whole
            return None
        else:
            total += p.numel()  # a DTensor's numel is the global one
    return total


def _sharding(modules: list, optimizers: list) -> tuple[str, int | None, int | None]:
    """(sharding, ZeRO stage or its FSDP equivalent, ranks sharded over), recognised by class name."""
    for optimizer in optimizers:
        stage = _deepspeed_stage(optimizer)
        if stage is not None:
            counts = getattr(optimizer, "partition_count", None)  # stage 1/2: ranks per parameter group
            degree = counts[0] if isinstance(counts, list) and counts else counts
            group = getattr(optimizer, "dp_process_group", None) or getattr(optimizer, "ds_process_group", None)
            return "deepspeed", stage, int(degree) if isinstance(degree, int) else _group_size(group)
    for module in modules:
        names = {type(m).__name__ for m in module.modules()}
        if "FullyShardedDataParallel" in names:
            return _fsdp1(module)
        if any(n.startswith("FSDP") for n in names):  # fully_shard's FSDPModule subclasses: FSDPLinear, ...
            return "fsdp2", _fsdp2_stage(module), _fsdp2_degree(module)
        if type(module).__name__ == "DistributedDataParallel":
            return "ddp", 0, None
        stage = _deepspeed_stage(getattr(module, "optimizer", None))
        if stage is not None:
            return "deepspeed", stage, None
    return "none", None, None


def _deepspeed_stage(optimizer) -> int | None:
    name = type(optimizer).__name__
    if not type(optimizer).__module__.startswith("deepspeed."):
        return None
    if name.endswith("Stage3"):
        return 3
    if name == "DeepSpeedZeroOptimizer":
        return 2 if getattr(optimizer, "partition_gradients", False) else 1
    return 0


def _fsdp1(module) -> tuple[str, int | None, int | None]:
    strategy = str(getattr(module, "sharding_strategy", "")).rsplit(".", 1)[-1].lower()
    stage = {"full_shard": 3, "hybrid_shard": 3, "shard_grad_op": 2, "_hybrid_shard_zero2": 2, "no_shard": 0}
    return "fsdp1", stage.get(strategy), _group_size(getattr(module, "process_group", None))


def _fsdp2_stage(module) -> int:
    """fully_shard reshards parameters after forward (ZeRO-3) unless told not to: then they stay whole from
    forward to backward, as ZeRO-2 keeps them."""
    try:
        param_group = module._get_fsdp_state()._fsdp_param_group
        return 3 if param_group is None or param_group.post_forward_mesh_info is not None else 2
    except Exception:
        return 3


def _fsdp2_degree(module) -> int | None:
    for p in module.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            return int(mesh.size(mesh.ndim - 1))  # fully_shard shards over the last dimension (HSDP: shard)
    return None


def _group_size(group) -> int | None:
    try:
        return int(group.size()) if group is not None else None
    except Exception:
        return None
