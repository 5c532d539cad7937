"""The two DeepSpeed engines: the encoder's (from --deepspeed_config) and the noiser's.

Each model has its own engine, JSON config, optimizer and checkpoint directory. Both engines are
built alike, from the resolved config as a dict (``config=``) and no ``args`` (DeepSpeed asserts
when given a config both ways). A fact this file relies on (checked on deepspeed 0.19.8): a
parameter frozen at initialize is excluded for good under ZeRO-3, so everything starts
trainable.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deepspeed
import pydantic
import torch
import torch.nn as nn
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.config import DeepSpeedConfig
from torch.optim.lr_scheduler import LambdaLR

from advpt import ds_configs
from advpt.errors import ConfigError, first_line
from advpt.native_builds import load_deepspeed_op
from advpt.safe_load import read_json
from advpt.training.engines.batch_layout import DeepSpeedJson
from advpt.weight_decay import parameter_groups


def _check_optimizer_numbers(config: dict[str, Any], path: str) -> None:
    """The optimizer's numbers (lr, betas, eps, weight_decay) are finite and not negative; JSON
    as Python reads it admits NaN and Infinity, and the optimizer would refuse them later."""
    optimizer = config.get("optimizer")
    params = optimizer.get("params", {}) if isinstance(optimizer, dict) else {}
    for key, value in params.items() if isinstance(params, dict) else ():
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                continue
            if not (math.isfinite(number) and number >= 0):
                raise ConfigError(
                    f"DeepSpeed config {path}: optimizer.params.{key} must be a finite number "
                    f"of at least 0, not {first_line(json.dumps(value), 60)}"
                )


def read_ds_config(name: str, job_name: str) -> DeepSpeedJson:
    """A DeepSpeed JSON as written: ``name`` is a path, a short name of a shipped config for the
    role ``job_name`` (encoder, noiser, finetune) or ``auto`` (``advpt.ds_configs``). Its batch
    settings are the batch layout's to read (``advpt.training.engines.batch_layout``)."""
    on_cpu = get_accelerator().device_name() == "cpu"
    file = ds_configs.resolve(name, job_name, on_cpu)
    if file is None:
        raise ConfigError(
            f"DeepSpeed config {name} is neither a file nor a shipped {job_name} config "
            f"({', '.join(ds_configs.names(job_name))})"
        )
    config = read_json(file, ConfigError, dict, "a DeepSpeed config (a JSON object)")
    return DeepSpeedJson(name, str(file), config)


def load_ds_config(
    json_: DeepSpeedJson,
    batch: dict[str, int],
    monitor_dir: Path,
    job_name: str,
    lr: float | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config an engine is built from: ``json_`` with the batch layout's
    ``batch`` settings (``BatchLayout.deepspeed_settings``) and ``lr`` (the optimizer's peak,
    unless None) applied, checked by DeepSpeed. DeepSpeed's own monitor writes to
    ``monitor_dir`` as ``job_name`` unless the JSON names an output path, so each engine's
    scalars land beside the run's own."""
    path, config = json_.path, copy.deepcopy(json_.settings)
    _check_optimizer_numbers(config, path)
    config.update(batch)
    if lr is not None:
        params = config.get("optimizer", {}).get("params")
        if not isinstance(params, dict):
            raise ConfigError(f"DeepSpeed config {path} has no optimizer params to set lr in")
        params["lr"] = lr
    _check_with_deepspeed(path, config)
    board = config.get("tensorboard")
    if isinstance(board, dict) and board.get("enabled"):
        board.setdefault("output_path", str(monitor_dir))
        board.setdefault("job_name", job_name)
    return config


def _check_with_deepspeed(path: str, config: dict[str, Any]) -> None:
    """Let DeepSpeed parse the config now, turning its validation errors into one sentence.

    The global batch is left out: the batch layout has checked its arithmetic, and DeepSpeed
    derives it from micro-batch x accumulation x the ranks of its process group.
    """
    checked = copy.deepcopy(config)
    checked.pop("train_batch_size", None)
    try:
        DeepSpeedConfig(checked)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(
            f"DeepSpeed config {path} is rejected by DeepSpeed: {exc.title} key {where!r}: "
            f"{first['msg']}"
        ) from None
    except (AssertionError, ValueError, KeyError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"DeepSpeed config {path} is rejected by DeepSpeed: {reason}") from None


# AdamW implementations a DeepSpeed config can ask for: torch's (``torch_adam``; per-tensor
# loops or, ``fused``, one kernel per step: nothing to compile) or DeepSpeed's own (FusedAdam on a
# GPU, CPU Adam on a CPU: C++/CUDA ops compiled on first use, for minutes).
ADAM_IMPLEMENTATIONS = ("torch", "torch-fused", "deepspeed")
PRECISIONS = ("fp32", "bf16", "bf16-autocast", "fp16")


def simple_ds_config(
    micro: int,
    batch: int | None = None,
    lr: float = 1e-3,
    precision: str = "fp32",
    zero: int = 0,
    adam: str = "torch",
) -> dict[str, Any]:
    """A DeepSpeed config for the scripts and tests: AdamW (weight decay 0.01), gradient
    clipping 1.0, ZeRO stage ``zero``, no console logging, no throughput timer (it syncs).

    ``batch`` is the global batch (default ``micro``: one rank, no accumulation), so the
    accumulation is ``batch / (micro x ranks)``. ``precision`` is one of ``PRECISIONS``: fp32,
    bf16 (DeepSpeed's bf16 optimizer: bf16 weights, fp32 master copies), bf16-autocast (fp32
    weights, the forward in ``torch.autocast``: no host sync with ``adam`` torch-fused at ZeRO
    0) or fp16 (dynamic loss scaling). ``adam`` is one of ``ADAM_IMPLEMENTATIONS``.
    """
    if adam not in ADAM_IMPLEMENTATIONS:
        raise ValueError(f"adam must be one of {', '.join(ADAM_IMPLEMENTATIONS)}, not {adam!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    params: dict[str, Any] = {"lr": lr, "weight_decay": 0.01}
    if adam != "deepspeed":
        params["torch_adam"] = True
    if adam == "torch-fused":
        params["fused"] = True  # passed on to torch.optim.AdamW by DeepSpeed
    config: dict[str, Any] = {
        "train_batch_size": batch or micro,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": zero},
        "optimizer": {"type": "AdamW", "params": params},
        "timers": {"throughput": {"enabled": False}},
        "steps_per_print": 10**9,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "bf16-autocast":
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


def warmup_linear_decay(
    warmup_steps: int, total_steps: int, min_ratio: float
) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, then linear decay to
    ``min_ratio`` at ``total_steps``, held there after.

    The paper's schedule decays to 0, which spends the last steps of a run (all of a short one's
    decay) at a learning rate too small to learn anything; a floor keeps them useful.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        left = max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
        return min_ratio + (1.0 - min_ratio) * left

    return factor


class NonFiniteStepGuard:
    """A plain optimizer (ZeRO stage 0, fp32 weights) that skips steps whose gradients are not
    finite, and clips them to ``max_norm`` (the JSON's ``gradient_clipping``; 0: no clipping).

    DeepSpeed's ZeRO and bf16/fp16 optimizers skip such steps themselves, reading an overflow
    flag on the host every step. A plain optimizer has no check: without this guard one NaN batch
    would write NaN into every weight and Adam moment.

    An optimizer that can skip a step on the device (torch's fused Adam and AdamW, ``"fused":
    true``: it takes a ``found_inf`` flag, as ``torch.amp.GradScaler`` hands it one) is guarded
    without a host sync: the gradients' global norm, the clipping and the flag are computed on the
    device, and the optimizer leaves weights, moments and step count as they were when the flag
    is set. Skipped steps are counted on the device and read at logging steps
    (:func:`settle_skipped_steps`). DeepSpeed sees no overflow, so its LR schedule advances over
    a skipped step, where its own check holds the schedule back. Any other optimizer costs one
    host sync per step: the flag is read and the step skipped on the host.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, max_norm: float, parameters: list[nn.Parameter]
    ):
        """``parameters``: the model's, in its order, which the norm sums over (DeepSpeed's
        order, so that the clipped gradients are those DeepSpeed's clipping made)."""
        self.optimizer = optimizer
        self.max_norm = max_norm
        self.parameters = parameters
        self.on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        self.overflow = False  # what DeepSpeed reads: only set where the flag is read on the host
        self._skipped: torch.Tensor | None = None  # since the last settle, on the device
        self._in_a_row: torch.Tensor | None = None
        self._most_in_a_row: torch.Tensor | None = None

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.parameters if p.grad is not None]

    def step(self, closure=None):
        grads = self._grads()
        if not grads:
            return self.optimizer.step(closure)
        norm = torch.stack(torch._foreach_norm(grads)).pow(2).sum().pow(0.5)  # as DeepSpeed's
        if self.max_norm > 0:
            torch._foreach_mul_(grads, torch.clamp(self.max_norm / (norm + 1e-6), max=1.0))
        found_inf = (~torch.isfinite(norm)).float()
        if self.on_device:
            self._count(found_inf)
            self.optimizer.found_inf = found_inf
            try:
                return self.optimizer.step(closure)
            finally:
                del self.optimizer.found_inf
        self.overflow = bool(found_inf)  # the one host sync of an optimizer that cannot skip
        if self.overflow:
            for grad in grads:
                grad.zero_()
            return None
        return self.optimizer.step(closure)

    def _count(self, found_inf: torch.Tensor) -> None:
        if self._skipped is None:
            self._skipped, self._in_a_row, self._most_in_a_row = torch.zeros(
                3, dtype=torch.float32, device=found_inf.device
            ).unbind()
        self._skipped = self._skipped + found_inf
        self._in_a_row = (self._in_a_row + 1) * found_inf
        self._most_in_a_row = torch.maximum(self._most_in_a_row, self._in_a_row)

    def settle(self) -> tuple[int, int]:
        """(steps skipped since the last call, the longest run of skips in a row that reaches
        into that time, counted whole across calls), read from the device."""
        if self._skipped is None:
            return 0, 0
        skipped, most = map(int, torch.stack([self._skipped, self._most_in_a_row]).tolist())
        self._skipped = torch.zeros_like(self._skipped)
        self._most_in_a_row = self._in_a_row.clone()  # a run of skips may go on
        return skipped, most

    def __getattr__(self, name: str):
        return getattr(self.optimizer, name)


def skips_on_device(engine: deepspeed.DeepSpeedEngine) -> bool:
    """Whether ``engine``'s skipped steps are counted on the device (:class:`NonFiniteStepGuard`)
    rather than in ``skipped_steps`` and ``was_step_applied()`` at every step."""
    return isinstance(engine.optimizer, NonFiniteStepGuard) and engine.optimizer.on_device


def settle_skipped_steps(engine: deepspeed.DeepSpeedEngine) -> int | None:
    """For an engine that skips on the device: its skips since the last call added to
    ``engine.skipped_steps`` (which DeepSpeed checkpoints), and the longest run of them in a row
    returned (:meth:`NonFiniteStepGuard.settle`; a host sync: at logging steps and saves only).
    None for any other engine."""
    if not skips_on_device(engine):
        return None
    skipped, most = engine.optimizer.settle()
    engine.skipped_steps += skipped
    return most


class Autocast(nn.Module):
    """``module`` run in ``torch.autocast`` on ``device`` in ``dtype``; its parameters are the
    module's own."""

    def __init__(self, module: nn.Module, device: str, dtype: torch.dtype):
        super().__init__()
        self.module, self.device, self.dtype = module, device, dtype

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type=self.device, dtype=self.dtype):
            return self.module(*args, **kwargs)


def plain_module(engine: deepspeed.DeepSpeedEngine) -> nn.Module:
    """``engine``'s model to call outside the engine (the model a phase does not train), in the
    engine's ``torch_autocast`` precision when it has one: the engine's forward enters it, the
    plain module does not."""
    if not engine.torch_autocast_enabled():
        return engine.module
    return Autocast(engine.module, get_accelerator().device_name(), engine.torch_autocast_dtype())


def adam_op_builder(config: dict[str, Any]) -> str | None:
    """The DeepSpeed op builder that ``config``'s optimizer compiles on first use: CPU Adam on
    the CPU or with the optimizer offloaded there, FusedAdam on a GPU; None for torch's AdamW
    (``torch_adam``) and for other optimizers."""
    optimizer = config.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
        return None
    if optimizer.get("params", {}).get("torch_adam"):
        return None
    offload = config.get("zero_optimization", {}).get("offload_optimizer") or {}
    if get_accelerator().device_name() == "cpu" or offload.get("device") in ("cpu", "nvme"):
        return "CPUAdamBuilder"
    return "FusedAdamBuilder"


def build_engine(
    model: nn.Module,
    config: dict[str, Any],
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
) -> deepspeed.DeepSpeedEngine:
    """Wrap ``model`` in a DeepSpeed engine with a warmup + linear-decay LR schedule.

    The learning rate decays to ``min_lr_ratio`` x the JSON's peak ``lr``. A ``scheduler`` block
    in the JSON takes precedence over the built-in schedule.
    """
    schedule = None
    if "scheduler" not in config:
        factor = warmup_linear_decay(warmup_steps, total_steps, min_lr_ratio)

        def schedule(optimizer: torch.optim.Optimizer) -> LambdaLR:
            return LambdaLR(optimizer, factor)

    if builder := adam_op_builder(config):
        load_deepspeed_op(builder)  # built under advpt's lock, never waiting on a dead build
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=parameter_groups(model),
        config=config,
        lr_scheduler=schedule,
    )
    if engine.optimizer is engine.basic_optimizer:
        clip, parameters = engine.gradient_clipping(), list(engine.module.parameters())
        engine.optimizer = NonFiniteStepGuard(engine.optimizer, clip, parameters)
        # the guard clips, on the norm it computes anyway; DeepSpeed's own clipping of a plain
        # optimizer would compute it again, a norm and a multiplication per parameter
        engine.clip_fp32_gradients = lambda: None
    if engine.zero_optimization_stage() == 0 and engine.dp_world_size == 1:
        # Alone, DeepSpeed would still flatten every gradient into one buffer, all-reduce it
        # over one rank and copy each back: two ops per parameter a step for nothing. At ZeRO
        # 1-3 the reduction also moves the gradients into the optimizer's partitions: kept.
        engine.enable_backward_allreduce = False
    return engine


def current_lr(engine: deepspeed.DeepSpeedEngine) -> float:
    return float(engine.get_lr()[0])
