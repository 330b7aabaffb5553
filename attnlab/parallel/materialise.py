"""A pipeline rank holds its own stage only: the whole model's modules on the meta device (names
and shapes, no memory), the parameters of this rank's stage on its device.

    model = build_stage(config, index=1, num_stages=2)        # stage 1's parameters on the CPU, the rest meta
    materialise_stage(meta_model, 1, 2, source, device)       # the same, in place, from a seed or a weights file

Where a stage's weights come from (`attnlab.training.setup.start.StageSource`, which `pretrain_setup`
gives the meta model of a run with parallel.pp > 1 as its `stage_source`):

    rng_state   initialised as `build_model` initialises the whole model from that state of
                torch's CPU generator, bit for bit, the generator left where the whole build leaves it
    weights     read from a model.safetensors (an `attnlab.save` folder, a run's checkpoint): only
                the stage's tensors are read from the file (safetensors reads tensors by name)

How `build_stage` gives the stage the values the whole model would have without building it:
`build_model` draws each parameter's initial values from the CPU generator in a fixed order
(each module's own initialisation as it is constructed, then `init_weights` over the linear and
embedding weights). The model is built twice: on the meta device first, to learn which
parameters the stage holds, in the order they are registered; then on the CPU with every other
parameter replaced, as it is registered, by a one-element placeholder. A random fill of a
placeholder (normal_, uniform_, ...) is drawn into a scratch tensor of its shape and thrown away,
any other in-place write to it skipped: the generator advances exactly as in the whole build, so
the stage's parameters take the very values of the whole model's. Peak memory: the stage plus the
largest parameter (one scratch at a time). Buffers (position tables, slopes) are built whole on
the CPU: they are small and computed, not drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.modules.module as torch_module
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.config import ModelConfig
from attnlab.parallel.stages import StageModule, check_pipeline_supported
from attnlab.training.setup.start import StageSource

# the in-place random fills of torch's generators: their draws must happen, into a scratch tensor
RANDOM_FILLS = frozenset({"uniform_", "normal_", "bernoulli_", "random_", "exponential_", "cauchy_", "log_normal_",
                          "geometric_"})


class _Placeholders(TorchDispatchMode):
    """Stands one-element placeholders in for the parameters another stage holds, while a model is
    built: their random fills draw into a scratch tensor (the generator advances as it would),
    their other in-place writes are skipped."""

    def __init__(self) -> None:
        super().__init__()
        self._bases: dict[int, Tensor] = {}  # storage address -> the one element (kept alive: addresses stay unique)

    def make(self, p: Tensor) -> nn.Parameter:
        base = torch.empty(1, dtype=p.dtype)
        self._bases[base.untyped_storage().data_ptr()] = base
        return nn.Parameter(base.expand(p.shape), requires_grad=p.requires_grad)

    def holds(self, t: object) -> bool:
        return isinstance(t, Tensor) and not t.is_meta and t.untyped_storage().data_ptr() in self._bases

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable and args and self.holds(args[0]):
            if func.overloadpacket.__name__ in RANDOM_FILLS:
                func(torch.empty(args[0].shape, dtype=args[0].dtype), *args[1:], **kwargs)
            return args[0]
        return func(*args, **kwargs)


class _Registrations:
    """Every parameter registration while a model is built, in order (a global torch hook),
    each answered by `decide(index, module, name, param)`: None keeps the parameter, else its stand-in."""

    def __init__(self, decide: Callable[[int, nn.Module, str, Tensor], nn.Parameter | None]):
        self.decide, self.count = decide, 0

    def __enter__(self) -> "_Registrations":
        self._handle = torch_module.register_module_parameter_registration_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def _hook(self, module: nn.Module, name: str, param: Tensor | None) -> nn.Parameter | None:
        if param is None:
            return None
        self.count += 1
        return self.decide(self.count - 1, module, name, param)


def _registration_plan(config: ModelConfig, index: int, num_stages: int) -> list[tuple[bool, tuple[int, ...]]]:
    """(held by the stage, shape) of each parameter registration of `build_model(config)`, in order."""
    from attnlab.models import build_model

    seen: list[Tensor] = []
    with torch.device("meta"), _Registrations(lambda i, module, name, p: seen.append(p)):
        model = build_model(config)
    held = {id(p) for p in StageModule(model, index, num_stages).parameters()}
    return [(id(p) in held, tuple(p.shape)) for p in seen]


def build_stage(config: ModelConfig, index: int, num_stages: int, *, initialise: bool = True) -> nn.Module:
    """`build_model(config)` where only stage `index` of `num_stages` holds its parameters (on the
    CPU, equal to the whole model's built from the same generator state), every other parameter
    on the meta device; torch's CPU generator is left where `build_model` leaves it (module docstring).
    initialise=False: the stage's parameters stay on the meta device too (its weights are read
    from a file), the buffers alone are made.

    Raises:
        ValueError: a model or split `check_pipeline_supported` refuses.
        RuntimeError: a model whose construction registers different parameters on the meta device.
    """
    from attnlab.models import build_model

    check_pipeline_supported(config, num_stages)
    plan = _registration_plan(config, index, num_stages)
    stand_ins = _Placeholders()

    def decide(i: int, module: nn.Module, name: str, p: Tensor) -> nn.Parameter | None:
        if i >= len(plan) or plan[i][1] != tuple(p.shape):
            raise RuntimeError(f"{type(module).__name__}.{name}: registration {i} of a {config.arch} differs from its "
                               "meta-device build; the stage cannot be built alone")
        return None if (initialise and plan[i][0]) or stand_ins.holds(p) else stand_ins.make(p)

    with _Registrations(decide) as registrations, stand_ins:
        model = build_model(config)
    if registrations.count != len(plan):
        raise RuntimeError(f"a {config.arch} registered {registrations.count} parameters, its meta-device build "
                           f"{len(plan)}; the stage cannot be built alone")
    metas: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and stand_ins.holds(p):
                if id(p) not in metas:
                    metas[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                                requires_grad=p.requires_grad)
                module._parameters[name] = metas[id(p)]
    return model


def _set(model: nn.Module, dotted: str, value: Tensor, kind: str) -> None:
    owner, _, leaf = dotted.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    getattr(module, kind)[leaf] = value


def to_device(model: nn.Module, device: torch.device | str) -> nn.Module:
    """`model` with every parameter and buffer that holds data moved to `device` in place (each
    Parameter object kept, ties too), those on the meta device left there: a pipeline rank's model
    (`materialise_stage`) moves its stage alone."""
    device = torch.device(device)
    with torch.no_grad():
        for module in model.modules():
            for name, p in module._parameters.items():
                if p is not None and not p.is_meta and p.device != device:
                    p.data = p.data.to(device)
            for name, b in module._buffers.items():
                if b is not None and not b.is_meta and b.device != device:
                    module._buffers[name] = b.to(device)
    return model


def release_other_stages(model: nn.Module, stage: nn.Module) -> nn.Module:
    """Put every parameter of `model` that `stage` does not hold on the meta device, in place (a
    tied one stays tied): a model built or read whole keeps its stage alone. Returns `model`."""
    held = {id(p) for p in stage.parameters()}
    metas: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and not p.is_meta and id(p) not in held:
                if id(p) not in metas:
                    metas[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                                requires_grad=p.requires_grad)
                module._parameters[name] = metas[id(p)]
    return model


def has_meta(model: nn.Module) -> bool:
    """Whether some of `model`'s parameters are on the meta device (hold no data)."""
    return any(p.is_meta for p in model.parameters())


def materialise_stage(model: nn.Module, index: int, num_stages: int, source: StageSource,
                      device: torch.device | str) -> nn.Module:
    """Give stage `index` of `num_stages` of the meta model `model` its parameters and buffers, on
    `device`, in place (each module keeps its place; the other stages' parameters stay meta):
    initialised from `source.rng_state` as `build_stage` does (the CPU generator left where a whole
    build leaves it), or read from `source.weights`, only the stage's tensors (`read_stage_weights`).

    Raises:
        ValueError: a weights file that lacks one of the stage's tensors or holds it in another shape.
    """
    config = model.config
    if source.rng_state is not None:
        torch.set_rng_state(source.rng_state)
        built = build_stage(config, index, num_stages)
    else:
        with torch.random.fork_rng(devices=[]):  # buffers only: every parameter a stand-in, no draw kept
            built = build_stage(config, index, num_stages, initialise=False)
        held = {id(p) for p in StageModule(model, index, num_stages).parameters()}
        read = read_stage_weights(source.weights, model, held)
        for name, p in list(built.named_parameters(remove_duplicate=False)):
            if name in read:
                _set(built, name, read[name], "_parameters")
    for name, p in built.named_parameters(remove_duplicate=False):
        if not p.is_meta:
            _set(model, name, p, "_parameters")
    for name, b in built.named_buffers(remove_duplicate=False):
        _set(model, name, b, "_buffers")
    return to_device(model, device)


def read_stage_weights(path: Path, model: nn.Module, held: set[int]) -> dict[str, nn.Parameter]:
    """The parameters of `model` whose ids are in `held`, read from the safetensors file `path`
    (by any name of a tied tensor; float32), each as one Parameter under all of its names; the
    other tensors of the file are not read.

    Raises:
        ValueError: a tensor missing from the file or of another shape (naming it and the file).
    """
    from attnlab.io.weights import read_safetensors, safetensors_names, upgraded

    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in held:
            by_id.setdefault(id(p), []).append(name)
    available = safetensors_names(path)
    wanted = {key: next((n for n in names if n in available), None) for key, names in by_id.items()}
    if any(found is None for found in wanted.values()):  # older names: the whole file, renamed (`upgraded`)
        state = upgraded(model, read_safetensors(path))
    else:
        state = read_safetensors(path, names=sorted(set(wanted.values())))
    shapes = {id(p): p.shape for p in model.parameters()}
    out: dict[str, nn.Parameter] = {}
    for key, names in by_id.items():
        found = next((n for n in names if n in state), None)
        if found is None:
            raise ValueError(f"{path} has no tensor {names[0]} (the stage's weights)")
        if state[found].shape != shapes[key]:
            raise ValueError(f"{path}: {found} has shape {tuple(state[found].shape)}, the model "
                             f"{tuple(shapes[key])}")
        p = nn.Parameter(state[found].float())
        for n in names:
            out[n] = p
    return out



def rank_device(ctx, config) -> torch.device:
    """Where this rank trains, as the Trainer decides it: the context's device (cuda:LOCAL_RANK
    under NCCL) when train.device asks for a GPU and one is there, else the CPU."""
    wants_gpu = config.train.device == "cuda" or (config.train.device == "auto" and torch.cuda.is_available())
    return ctx.device if wants_gpu else torch.device("cpu")


def stage_estimate(model: nn.Module, ctx, config) -> "MemoryEstimate":
    """This rank's stage at the peak of a step, as `attnlab parallel plan` predicts it: its own
    parameters (a tensor-parallel rank's shard), their gradients and Adam states (4 + 4 + 8 bytes
    each), and the activations of the micro-batches its schedule keeps, times AUTOGRAD_FACTOR
    (the bytes autograd holds per counted output, attnlab.training.setup.memory)."""
    from attnlab.parallel.plan import plan_layout
    from attnlab.training.setup.memory import ADAM_BYTES, AUTOGRAD_FACTOR, PARAM_BYTES, MemoryEstimate, batch_shape

    par, shape = config.parallel, batch_shape(config.data)
    stage = StageModule(model, ctx.pp_rank, ctx.pp_size)
    params, act = sum(p.numel() for p in {id(p): p for p in stage.parameters()}.values()), 0
    try:
        plan = plan_layout(model.config, nproc=ctx.world_size, tp=ctx.tp_size, pp=ctx.pp_size, dp=ctx.dp_size,
                           micro_batches=par.micro_batches, seq_len=shape.seq_len, tgt_len=shape.tgt_len,
                           batch=shape.rows * config.train.grad_accum)
        row = plan["stages"][ctx.pp_rank]
        params = row["params_per_rank"]
        act = row["activation_bytes_gpipe" if par.schedule == "gpipe" else "activation_bytes_1f1b"] * AUTOGRAD_FACTOR
    except ValueError:  # a batch the micro-batches do not divide: refused by name where it is cut
        pass
    return MemoryEstimate(weights=PARAM_BYTES * params, gradients=PARAM_BYTES * params,
                          optimizer=ADAM_BYTES * params, per_row=act, rows=1)


def materialise_rank_stage(model: nn.Module, ctx, config) -> nn.Module:
    """This rank's stage of the meta model `model`, made in place on this rank's device from its
    `stage_source` (`materialise_stage`), after checking that the stage's training step fits in
    the memory there is (train.check_memory; `check_stage_memory`).

    Raises:
        ValueError: a meta model without a stage_source.
        ConfigError: a stage too large for this rank's memory, naming parallel.pp.
    """
    from attnlab.training.setup.memory import check_stage_memory

    source = getattr(model, "stage_source", None)
    if not isinstance(source, StageSource):
        raise ValueError("a model on the meta device needs a stage_source (attnlab.training.setup.start.StageSource) "
                         "to make its pipeline stage from")
    if ctx.pp_size < 2:
        raise ValueError(f"a model on the meta device trains under pipeline parallel (parallel.pp > 1), got "
                         f"pp={ctx.pp_size}")
    device = rank_device(ctx, config)
    if config.train.check_memory:
        check_stage_memory(stage_estimate(model, ctx, config), device,
                           stage=f"pipeline stage {ctx.pp_rank} of {ctx.pp_size}")
    return materialise_stage(model, ctx.pp_rank, ctx.pp_size, source, device)
