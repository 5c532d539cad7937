"""The DeepSpeed JSONs shipped with advpt, named by short names that work from any directory.

    --deepspeed_config gpu-bf16          ds_configs/encoder/gpu-bf16.json
    --noiser_deepspeed_config gpu        ds_configs/noiser/gpu.json
    --deepspeed_config my/encoder.json   any path to a JSON file works too

The files live once, in the repository's top-level ``ds_configs/<role>/`` (encoder, noiser,
finetune), where a DeepSpeed user looks for a config to copy; ``shipped`` beside this file links
there, so a checkout and an editable install read them in place, and a wheel or sdist carries
them inside the package under the same name. ``python -m advpt.train --print_ds_config
encoder/gpu-bf16`` prints one. ``auto`` (the default) is ``cpu`` on DeepSpeed's CPU accelerator
and the role's GPU config otherwise. The shipped encoder configs state the micro-batch per rank
(and the accumulation), never ``train_batch_size``, so they run unchanged on any number of
ranks: DeepSpeed derives the global batch as micro-batch x accumulation x ranks. The shipped
noiser configs state no batch sizes at all: the noiser sees the encoder's micro-batches, so it
follows the encoder's batch settings.
"""

from __future__ import annotations

from pathlib import Path

from advpt.errors import ConfigError

AUTO = "auto"
ROLES = ("encoder", "noiser", "finetune")
# The config ``auto`` picks for each role: (on the CPU accelerator, on a GPU).
AUTO_NAMES = {
    "encoder": ("cpu", "gpu-bf16"),
    "noiser": ("cpu", "gpu"),
    "finetune": ("cpu", "gpu-bf16"),
}
SHIPPED = Path(__file__).resolve().parent / "shipped"


def names(role: str) -> list[str]:
    """The short names shipped for ``role``."""
    return sorted(path.stem for path in (SHIPPED / role).glob("*.json"))


def shipped(name: str, role: str) -> Path | None:
    """The shipped JSON called ``name`` for ``role``, or None if there is none."""
    return SHIPPED / role / f"{name}.json" if name in names(role) else None


def resolve(value: str, role: str, on_cpu: bool) -> Path | None:
    """The JSON file ``value`` means: a path to a file, a short name, or ``auto``.

    A file of that name in the working directory wins over a short name. None if it is none of
    them (the caller says so, listing :func:`names`).
    """
    if value == AUTO:
        value = AUTO_NAMES[role][0 if on_cpu else 1]
    path = Path(value)
    if path.is_file():
        return path
    return shipped(value, role)


def specs() -> list[str]:
    """Every shipped config as ``role/name``, the path under ``ds_configs/`` without .json."""
    return [f"{role}/{name}" for role in ROLES for name in names(role)]


def text(spec: str) -> str:
    """The shipped JSON ``role/name`` (e.g. ``encoder/gpu-bf16``), as written, to copy."""
    role, _, name = spec.partition("/")
    path = shipped(name, role) if role in ROLES else None
    if path is None:
        raise ConfigError(
            f"--print_ds_config {spec} is no shipped DeepSpeed config; one of {', '.join(specs())}"
        )
    return path.read_text()
