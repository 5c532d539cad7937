"""Which launcher started this process, and where its ranks meet.

Every launcher says in environment variables which rank a process is, but each in its own:

1. the ``deepspeed`` launcher and ``torchrun`` (and anything else torch's ``env://`` speaks):
   ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
2. ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, a compressed host list in
   ``SLURM_STEP_NODELIST`` (``gpu[01-04,07]``), whose first host is the meeting point unless
   ``MASTER_ADDR`` is set, and a port derived from ``SLURM_JOB_ID`` unless ``MASTER_PORT`` is;
3. OpenMPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``;
   ``MASTER_ADDR`` is needed unless every rank is on this machine.

:func:`discover` reads them in that order of precedence (``srun ... torchrun`` gives torchrun's
workers both sets: ``RANK`` wins) and :meth:`Launch.environ` writes the first set, the one
torch and DeepSpeed read, so DeepSpeed's own MPI discovery never runs. Without any of them
(``python -m advpt.train``, also inside an ``sbatch`` or ``salloc`` shell, where Slurm sets
``SLURM_NTASKS`` but the shell is not a task of a job step) the run is one process. An
environment that announces several tasks but does not say which one this is, or where the
ranks meet, is a ``ConfigError``: never N runs of one rank each. So is a value that is no
whole number, a rank not below its world, a port outside 1-65535, and a meeting host that does
not resolve within ``ADVPT_RENDEZVOUS_TIMEOUT`` seconds (:func:`check_meeting_point`, default
30): such a job could only wait for a peer that never comes.
"""

from __future__ import annotations

import itertools
import math
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from advpt.errors import ConfigError, shorten

MPI_DEFAULT_PORT = 29500
"""``mpirun`` gives no port: torch's (and DeepSpeed's MPI discovery's) default, unless set."""

RENDEZVOUS_TIMEOUT_ENV = "ADVPT_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_TIMEOUT_S = 30.0
"""How long the meeting host's name may take to resolve before the start is refused."""
_MAX_PROCESSES = 2**31 - 1  # torch keeps ranks and world sizes in C ints


@dataclass(frozen=True)
class Launch:
    """This process's place in the job, as its launcher gave it."""

    launcher: str  # "deepspeed", "torchrun", "env://", "srun", "mpirun" or "none"
    rank: int
    world: int
    local_rank: int
    local_world: int | None  # ranks on this node; None where the launcher does not say
    master_addr: str
    master_port: int

    def environ(self) -> dict[str, str]:
        """The variables torch's ``env://`` rendezvous and DeepSpeed read."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.local_world is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world)
        return env

    def describe(self) -> str:
        """One line for the start of a run: the launcher found and the world size."""
        if self.launcher == "none":
            return "no launcher found: one process"
        nodes = f", {self.local_world} on this node" if self.local_world is not None else ""
        return (
            f"launcher: {self.launcher}, {self.world} rank(s){nodes}, meeting at "
            f"{self.master_addr}:{self.master_port}"
        )

    def port_advice(self, port: int) -> str:
        """How to give this launcher another port (``port`` is a free one)."""
        if self.launcher in ("deepspeed", "torchrun"):
            flag = f"--master_port {port}"
            return f"give the {self.launcher} launcher a free one with --master_port, e.g. {flag}"
        return f"set MASTER_PORT to a free one, e.g. MASTER_PORT={port}"


def free_port() -> int:
    """A TCP port of this machine no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def discover(env: Mapping[str, str]) -> Launch:
    """This process's rank, world and meeting point from the launcher's variables in ``env``."""
    if "RANK" in env:
        return _from_torch(env)
    if _is_srun_task(env):
        return _from_srun(env)
    if "OMPI_COMM_WORLD_SIZE" in env:
        return _from_mpirun(env)
    return _one_process("none", env)


def announced_rank(env: Mapping[str, str]) -> int:
    """The rank the launcher's variables in ``env`` give this process, in :func:`discover`'s
    order of precedence but without the rest of what it needs: it decides which rank prints an
    error met before the process group exists. 0 where no launcher gives one, or where it is no
    rank of its world (that error is this process's own and must be printed)."""
    if "RANK" in env:
        rank_key, world_key = "RANK", "WORLD_SIZE"
    elif _is_srun_task(env):
        rank_key, world_key = "SLURM_PROCID", _srun_tasks_var(env)
    elif "OMPI_COMM_WORLD_SIZE" in env:
        rank_key, world_key = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    else:
        return 0
    try:
        return _rank(env, rank_key, _world(env, world_key))
    except (ConfigError, KeyError):
        return 0


def _one_process(launcher: str, env: Mapping[str, str]) -> Launch:
    """A world of one: it meets itself on this machine, on a free port unless one is given."""
    port = _port(env) if "MASTER_PORT" in env else free_port()
    return Launch(launcher, 0, 1, 0, 1, env.get("MASTER_ADDR", "127.0.0.1"), port)


def _from_torch(env: Mapping[str, str]) -> Launch:
    """``RANK`` and its companions: the deepspeed launcher, torchrun, or a hand-set group."""
    if "TORCHELASTIC_RUN_ID" in env:
        launcher = "torchrun"
    elif "CROSS_RANK" in env:  # set by deepspeed.launcher.launch alone
        launcher = "deepspeed"
    else:
        launcher = "env://"  # set by hand, or by a launcher that says no more
    _require(env, ["WORLD_SIZE"], "RANK is set")
    world = _world(env, "WORLD_SIZE")
    if world == 1:
        _rank(env, "RANK", 1)
        return _one_process(launcher, env)
    _require(
        env, ["LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"], f"RANK is set and WORLD_SIZE={world}"
    )
    local_world = next(
        (_integer(env, k) for k in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE") if k in env), None
    )
    return Launch(
        launcher,
        _rank(env, "RANK", world),
        world,
        _integer(env, "LOCAL_RANK"),
        local_world,
        env["MASTER_ADDR"],
        _port(env),
    )


_SPECIAL_STEPS = 0xFFFFFFF0  # Slurm's SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT, ... are above this


def _is_srun_task(env: Mapping[str, str]) -> bool:
    """A task of an ``srun`` job step has a step number. The batch shell of ``sbatch`` and the
    shell of ``salloc`` (even one in an interactive step) have none, or a negative or named
    one, whatever SLURM_NTASKS says; should one be printed unsigned, Slurm's special steps
    (batch, extern, interactive) are the top values of 32 bits, no srun step's number."""
    step = env.get("SLURM_STEP_ID", "").strip()
    return step.isdigit() and int(step) < _SPECIAL_STEPS


def _srun_tasks_var(env: Mapping[str, str]) -> str:
    """The variable holding the task count of this srun step (the job's, where not given)."""
    return "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"


def _from_srun(env: Mapping[str, str]) -> Launch:
    tasks_var = _srun_tasks_var(env)
    world = _world(env, tasks_var) if tasks_var in env else 1
    if world == 1:
        return _one_process("srun", env)
    context = f"SLURM_STEP_ID is set and {tasks_var}={world} (a task of an srun step)"
    _require(env, ["SLURM_PROCID", "SLURM_LOCALID"], context)
    rank = _rank(env, "SLURM_PROCID", world)
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    else:
        hosts_var = next((k for k in _NODELISTS if env.get(k)), None)
        if hosts_var is None:
            raise ConfigError(
                f"{context} but none of {', '.join(_NODELISTS)} or MASTER_ADDR is set: cannot "
                "tell where the ranks meet"
            )
        try:
            addr = expand_hostlist(env[hosts_var])[0]
        except ValueError as exc:
            raise ConfigError(
                f"{hosts_var}={env[hosts_var]!r} is not a Slurm host list: {exc}"
            ) from None
    if "MASTER_PORT" in env:
        port = _port(env)
    else:
        _require(env, ["SLURM_JOB_ID"], f"{context} and MASTER_PORT is not")
        port = slurm_port(_integer(env, "SLURM_JOB_ID"), _integer(env, "SLURM_STEP_ID"))
    return Launch(
        "srun", rank, world, _integer(env, "SLURM_LOCALID"), _slurm_local_world(env), addr, port
    )


_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")


def slurm_port(job_id: int, step_id: int) -> int:
    """The meeting port of an srun step: in [15000, 32000), below Linux's ephemeral ports (where
    the kernel picks outgoing ones), different for steps of one job run side by side and for
    jobs with neighbouring ids; every task of the step computes the same."""
    return 15000 + (16 * job_id + step_id) % 17000


def _slurm_local_world(env: Mapping[str, str]) -> int | None:
    """This node's task count, from ``SLURM_STEP_TASKS_PER_NODE`` (``4(x2),3``) and
    ``SLURM_NODEID``; None where they are missing or do not say."""
    for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if key in env and "SLURM_NODEID" in env:
            counts = []
            for part in env[key].split(","):
                match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
                if not match:
                    return None
                counts += [int(match[1])] * int(match[2] or 1)
            node = env["SLURM_NODEID"]
            return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None
    return None


def _from_mpirun(env: Mapping[str, str]) -> Launch:
    world = _world(env, "OMPI_COMM_WORLD_SIZE")
    if world == 1:
        return _one_process("mpirun", env)
    context = f"OMPI_COMM_WORLD_SIZE={world} (a rank of mpirun)"
    _require(env, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"], context)
    rank = _rank(env, "OMPI_COMM_WORLD_RANK", world)
    local_world = (
        _integer(env, "OMPI_COMM_WORLD_LOCAL_SIZE") if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else None
    )
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    elif local_world == world:
        addr = "127.0.0.1"
    else:
        raise ConfigError(
            f"{context} across several nodes (OMPI_COMM_WORLD_LOCAL_SIZE="
            f"{env.get('OMPI_COMM_WORLD_LOCAL_SIZE', 'unset')}) but MASTER_ADDR is not set: "
            "export the first node's address to every rank (mpirun -x MASTER_ADDR=...)"
        )
    port = _port(env) if "MASTER_PORT" in env else MPI_DEFAULT_PORT
    local_rank = _integer(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    return Launch("mpirun", rank, world, local_rank, local_world, addr, port)


def expand_hostlist(hostlist: str) -> list[str]:
    """The host names of a Slurm host list, in order: ``gpu[01-03,07],cpu3`` is ``gpu01``,
    ``gpu02``, ``gpu03``, ``gpu07``, ``cpu3``.

    A range keeps the zero padding of its first number; several bracket groups in one name
    multiply (``r[1-2]n[1-2]``: ``r1n1 r1n2 r2n1 r2n2``). ``ValueError`` says what is malformed.
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(hostlist):
        parts = re.split(r"\[([^\[\]]*)\]", item)  # name, group, name, group, ..., name
        if any("[" in p or "]" in p for p in parts[::2]):
            raise ValueError(f"unbalanced brackets in {item!r}")
        choices = [[p] if i % 2 == 0 else _expand_ranges(p) for i, p in enumerate(parts)]
        hosts += ["".join(c) for c in itertools.product(*choices)]
    if not hosts:
        raise ValueError("it names no host")
    return hosts


def _split_outside_brackets(hostlist: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets at character {i + 1}")
        if char == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    items.append(hostlist[start:])
    if depth:
        raise ValueError("a [ is never closed")
    if any(not item.strip() for item in items):
        raise ValueError("an empty host name")
    return [item.strip() for item in items]


def _expand_ranges(group: str) -> list[str]:
    """``01-03,07`` -> ``01 02 03 07``."""
    numbers = []
    for piece in group.split(","):
        low, dash, high = piece.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"[{group}] holds {piece!r}, not a number or a range of numbers")
        if dash and int(high) < int(low):
            raise ValueError(f"[{group}] holds the descending range {piece!r}")
        last = int(high) if dash else int(low)
        numbers += [str(n).zfill(len(low)) for n in range(int(low), last + 1)]
    return numbers


def _integer(env: Mapping[str, str], key: str, limit: int = 2**63 - 1) -> int:
    """``env[key]`` as a whole number up to ``limit``, or a ``ConfigError`` naming it."""
    value = env[key].strip()
    if not re.fullmatch(r"[0-9]+", value):
        raise ConfigError(f"environment variable {key}={shorten(value)} is not a whole number")
    if len(value.lstrip("0")) > len(str(limit)) or int(value) > limit:
        raise ConfigError(f"environment variable {key}={shorten(value)} is above {limit}")
    return int(value)


def _port(env: Mapping[str, str]) -> int:
    port = _integer(env, "MASTER_PORT")
    if not 1 <= port <= 65535:
        raise ConfigError(f"environment variable MASTER_PORT={port} is not a TCP port (1-65535)")
    return port


def _require(env: Mapping[str, str], keys: list[str], context: str) -> None:
    missing = [k for k in keys if k not in env]
    if missing:
        raise ConfigError(
            f"{context} but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: "
            "cannot tell this process's place in the job"
        )


def _rank(env: Mapping[str, str], key: str, world: int) -> int:
    rank = _integer(env, key, _MAX_PROCESSES)
    if rank >= world:
        raise ConfigError(f"environment variable {key}={rank} is not a rank of a world of {world}")
    return rank


def _world(env: Mapping[str, str], key: str) -> int:
    world = _integer(env, key, _MAX_PROCESSES)
    if world == 0:
        raise ConfigError(f"environment variable {key}=0: a job has at least one process")
    return world


def rendezvous_timeout(env: Mapping[str, str]) -> float:
    """Seconds the meeting host may take to resolve: ``ADVPT_RENDEZVOUS_TIMEOUT``, default 30."""
    text = env.get(RENDEZVOUS_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_RENDEZVOUS_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"environment variable {RENDEZVOUS_TIMEOUT_ENV}={text!r} is not a positive number of "
            "seconds"
        )
    return seconds


def check_meeting_point(launch: Launch, timeout: float) -> None:
    """A ``ConfigError`` unless ``launch.master_addr`` resolves within ``timeout`` seconds.

    torch would retry an unknown host for its whole rendezvous timeout (30 minutes), deaf to
    stop signals meanwhile. The lookup runs in a daemon thread, so that a resolver that hangs
    is not waited for either."""
    failure = [f"did not resolve within {timeout:g} s ({RENDEZVOUS_TIMEOUT_ENV})"]

    def resolve() -> None:
        try:
            socket.getaddrinfo(launch.master_addr, launch.master_port, type=socket.SOCK_STREAM)
            failure.clear()
        except (OSError, UnicodeError) as err:
            failure[0] = f"does not resolve ({err.args[-1] if err.args else err})"

    lookup = threading.Thread(target=resolve, name="advpt-resolve-master", daemon=True)
    lookup.start()
    lookup.join(timeout)
    if failure:
        raise ConfigError(
            f"environment variable MASTER_ADDR={launch.master_addr!r} {failure[0]}: unset it or "
            "give the address of the node where rank 0 runs"
        )
