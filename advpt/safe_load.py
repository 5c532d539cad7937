"""Reading files that others wrote: tensors and plain data only, any fault one sentence.

Every weight advpt reads comes through here: run checkpoints
(``advpt.training.checkpointing.store``, which passes DeepSpeed's few classes to admit), advpt
exports, TAPE and Hugging Face directories (``advpt.models``). Nothing read is unpickled beyond
tensors and plain data, no file outside a model directory is followed, and a weight file's tensors
are checked finite, so that a damaged or crafted file is a :class:`~advpt.errors.CheckpointError`
naming it."""

from __future__ import annotations

import enum
import json
import pickle
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advpt.errors import CheckpointError, first_line

if TYPE_CHECKING:
    import torch

# torch and safetensors are imported where tensors are read: data preparation reads its JSON
# through here and stays free of torch (its worker processes start faster).
State = dict[str, "torch.Tensor"]


def _admitted(safe_globals: Sequence[type]) -> list[Any]:
    """``safe_globals`` for ``torch.load``, and, if Enum classes are among them, a stand-in for
    ``getattr``: some Python releases (3.11.2, for one; not 3.11.7) pickle an Enum member as
    ``getattr(its class, its name)``, so a DeepSpeed checkpoint written there names
    ``builtins.getattr``. The stand-in returns members of those Enum classes and nothing else.
    """
    enums = tuple(c for c in safe_globals if isinstance(c, type) and issubclass(c, enum.Enum))
    if not enums:
        return list(safe_globals)

    def enum_member(owner: Any, name: str) -> enum.Enum:
        if owner in enums and isinstance(name, str) and name in owner.__members__:
            return owner[name]
        raise pickle.UnpicklingError(f"getattr({owner!r}, {name!r}) is not an allowed Enum member")

    return [*safe_globals, (enum_member, "builtins.getattr")]


def _refusal(err: pickle.UnpicklingError) -> str:
    """What PyTorch's weights-only refusal (a page of advice) says in a few words."""
    text = str(err)
    named = re.search(r"GLOBAL (\S+)", text) or re.search(r"Unsupported global: (\S+)", text)
    if named:
        return f"it refers to {named.group(1)}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return first_line(next((line for line in lines if "Unsupported" in line), text))


def load_weights_only(path: Path, safe_globals: Sequence[type] = (), mmap: bool = True) -> Any:
    """``torch.load`` that admits tensors and plain data only; any other file is one sentence.

    Refused, each as a ``CheckpointError`` naming ``path``: a file needing classes beyond
    ``safe_globals`` (unpickled in full, a crafted one runs code), one that is not a PyTorch
    archive (a raw pickle; with ``mmap``, also the pre-1.6 format), and a damaged one.
    """
    import torch

    try:
        with torch.serialization.safe_globals(_admitted(safe_globals)), warnings.catch_warnings():
            # A raw pickle draws a warning about its protocol before the refusal: noise.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path} holds more than tensors and plain data ({_refusal(err)}), so advpt will "
            "not unpickle it"
        ) from err
    except RuntimeError as err:
        if "mmap can only be used" in str(err):
            raise CheckpointError(
                f"{path} is not a PyTorch checkpoint archive (a raw pickle, an old format or a "
                "damaged file)"
            ) from err
        raise CheckpointError(f"{path} is damaged ({first_line(err)})") from err
    except (OSError, EOFError) as err:
        reason = getattr(err, "strerror", None) or first_line(err) or "it is empty or truncated"
        raise CheckpointError(f"cannot read {path}: {reason}") from err


def load_safetensors(path: Path) -> State:
    """Every tensor of a safetensors file, checked finite."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({first_line(err)})"
        ) from None
    return check_finite(state, path)


def load_state_dict(path: Path, mmap: bool = True) -> State:
    """The tensors of a ``torch.save``'d state dict (``.bin``, ``.pt``), checked finite; ``mmap``
    False reads the pre-1.6 format too (TAPE's files)."""
    import torch

    state = load_weights_only(path, mmap=mmap)
    if not isinstance(state, dict):
        raise CheckpointError(
            f"weights {path} hold a {type(state).__name__}, not a dict of tensors"
        )
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{path} holds a {type(value).__name__} under {first_line(repr(name), 60)}, "
                "not a tensor"
            )
    return check_finite(state, path)


def check_finite(state: State, source: Path) -> State:
    """``state``, unless one of its floating-point tensors holds a NaN or an infinity."""
    import torch

    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"tensor {name!r} of {source} holds non-finite values (NaN or infinity)"
            )
    return state


def read_json(
    path: Path,
    error: type[ValueError] = CheckpointError,
    holds: type = dict,
    what: str = "a JSON object",
) -> Any:
    """The JSON value in ``path``, which must be ``holds`` (``what``, in words); anything else is
    one ``error`` sentence naming the file. Every JSON file advpt reads comes through here:
    model configs, DeepSpeed configs, TAPE task files."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{path} is not valid JSON ({first_line(err)})") from None
    except RecursionError:
        raise error(f"{path} nests its JSON too deeply to be {what}") from None
    if not isinstance(content, holds):
        raise error(f"{path} must hold {what}, not a {type(content).__name__}")
    return content


def file_inside(root: Path, name: Any, named_by: Path) -> Path:
    """``root / name`` for a file name that ``named_by`` (an index, a config) gives, refused
    unless it stays inside ``root``: a plain file name (no separators, ``..`` or absolute
    path) that is no link to elsewhere.

    A Hugging Face cache snapshot (``.../snapshots/<revision>/``) links each file to the
    cache's own ``blobs/``: those links are followed, and no other.
    """
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
    ):
        raise CheckpointError(
            f"{named_by} names weight file {first_line(repr(name), 80)}, which is not a plain "
            f"file name inside {root}"
        )
    path = root / name
    target, home = path.resolve(), root.resolve()
    blobs = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
    if target.parent != home and not (blobs and target.parent == blobs):
        raise CheckpointError(f"weight file {path} is a link to {target}, outside {root}")
    return path
