"""What a figure was measured on: the one report of the device and the software, which the
benchmarks write beside their numbers and the GPU check, the study and the quickstart print
(``python -m advpt.environment``, :mod:`advpt.environment.__main__`, prints it).

torch and the other libraries are imported when a report is made, not with this module:
:func:`describe` reads a stored one where they are not installed.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advpt.errors import ConfigError

if TYPE_CHECKING:
    import torch

LIBRARIES = ("deepspeed", "transformers", "triton")  # reported by version, or "not installed"


def pick_device(name: str) -> torch.device:
    """``auto`` (a GPU if present, else the CPU) or a torch device name, checked: the device a
    ``--device`` flag names."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"--device {name!r} is not a device (auto, cpu, cuda, cuda:1, ...)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} asks for a GPU, but PyTorch sees none")
    return device


def device_name(device: Any = None) -> str:
    """The accelerator's name ("NVIDIA H200") where ``device`` (a ``torch.device``, or the
    current CUDA device for None) is a GPU and one is visible, else "CPU"."""
    import torch

    on_cpu = device is not None and torch.device(device).type != "cuda"
    if on_cpu or not torch.cuda.is_available():
        return "CPU"
    return torch.cuda.get_device_name(device)


def environment(device: Any = None, commit: str | None = None) -> dict[str, Any]:
    """The device (:func:`device_name`), the visible GPUs, the cores this process may use, torch's
    threads, the versions of Python, torch (and its CUDA), DeepSpeed, transformers and triton,
    advpt's commit (``commit``, else git's, else "unknown") and the date."""
    import torch

    info = {
        "device": device_name(device), "gpus": torch.cuda.device_count(),
        "cores": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }  # fmt: skip
    for name in LIBRARIES:  # by their metadata: importing DeepSpeed would print its own report
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    info["commit"] = commit or _git_commit() or "unknown"
    info["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return info


def describe(info: dict[str, Any]) -> str:
    """One line of a report, stored or just made; "?" for what it lacks."""
    i = {key: "?" for key in ("device", "gpus", "cores", "threads", "python", "torch",
                              *LIBRARIES, "commit", "date")} | info  # fmt: skip
    return (
        f"{i['device']} ({i['gpus']} GPU(s), {i['cores']} cores, {i['threads']} torch "
        f"thread(s)), Python {i['python']}, torch {i['torch']} (CUDA {i.get('cuda') or '-'}), "
        f"deepspeed {i['deepspeed']}, transformers {i['transformers']}, advpt {i['commit']}, "
        f"{i['date']}"
    )


def _git_commit() -> str | None:
    """advpt's short commit; None where the checkout has no .git or the machine no git."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
