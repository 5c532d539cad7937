"""Small builders shared by the training tests: DeepSpeed JSONs and train.py arguments."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import importlib
import importlib.util
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.tiers import starts_process, starts_ranks

REPO = Path(__file__).resolve().parent.parent


def write_ds_config(
    path: Path, micro: int = 8, accumulation: int = 1, world: int = 1, lr: float = 1e-3, **extra
) -> str:
    """A CPU DeepSpeed JSON (torch AdamW, no C++ op build) written to ``path``; ``extra`` keys
    replace the builder's (``advpt.training.engines.simple_ds_config``)."""
    from advpt.training.engines.engine import simple_ds_config

    config = simple_ds_config(micro, micro * accumulation * world, lr) | extra
    path.write_text(json.dumps(config))
    return str(path)


def tiny_run_args(tmp_path: Path, run_dir: Path, world: int = 1, **configs) -> list[str]:
    """Flags for a seconds-long adversarial run of the tiny presets on the bundled proteome."""
    encoder = write_ds_config(tmp_path / "encoder.json", world=world, **configs)
    noiser = write_ds_config(tmp_path / "noiser.json", world=world, lr=1e-2, **configs)
    return [
        "--deepspeed_config", encoder, "--noiser_deepspeed_config", noiser,
        "--encoder", "tiny", "--noiser", "tiny", "--max_length", "48",
        "--warmup_steps", "2", "--run_dir", str(run_dir), "--val_max_batches", "4",
    ]  # fmt: skip


def build_tiny_trainer(tmp_path: Path, *extra_args: str, run_dir: Path | None = None, **ds_extra):
    """An in-process Trainer (tiny presets, bundled proteome) on real DeepSpeed engines.

    Its ``config.json`` is written to the run directory, as ``advpt.train`` does.
    """
    import torch

    from advpt.config.cli import parse
    from advpt.config.pretrain import TrainConfig
    from advpt.training.assembly import build_trainer

    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir = run_dir or tmp_path / "run"
    args = tiny_run_args(tmp_path, run_dir, **ds_extra) + ["--num_workers", "0"]
    config = parse(TrainConfig, args + list(extra_args))
    torch.manual_seed(0)
    trainer = build_trainer(config, torch.device("cpu"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    return trainer


def build_with_noiser_json(tmp_path, noiser_settings: dict, *flags: str, **ds):
    """A tiny trainer whose noiser DeepSpeed JSON gets ``noiser_settings`` on top."""
    import torch

    from advpt.config.cli import parse
    from advpt.config.pretrain import TrainConfig
    from advpt.training.assembly import build_trainer

    args = tiny_run_args(tmp_path, tmp_path / "run", **ds)
    noiser_json = tmp_path / "noiser.json"
    noiser_json.write_text(json.dumps({**json.loads(noiser_json.read_text()), **noiser_settings}))
    torch.manual_seed(0)
    config = parse(TrainConfig, [*args, "--num_workers", "0", *flags])
    return build_trainer(config, torch.device("cpu"))


def pretrain_tiny(tmp_path: Path, run_dir: Path, **ds_extra):
    """A real two-step pre-training run (random MLM, tiny encoder) in this process; its trainer
    still holds the live engine. ``ds_extra`` goes into the DeepSpeed JSON (e.g. ZeRO, bf16)."""
    schedule = ["--mode", "random", "--max_steps", "2", "--checkpoint_every", "2"]
    trainer = build_tiny_trainer(tmp_path, *schedule, run_dir=run_dir, **ds_extra)
    trainer.train()
    return trainer


def bundled_clusters(path: Path, size: int = 3) -> Path:
    """A TSV putting the bundled proteome's records in clusters of ``size`` neighbours."""
    from advpt.data.bundled import BUNDLED_PROTEOME
    from advpt.data.cache import open_data

    dataset = open_data(BUNDLED_PROTEOME)
    path.write_text("".join(f"{dataset.name(i)}\tc{i // size}\n" for i in range(len(dataset))))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def _mlflow_hidden() -> str:
    """A folder whose ``mlflow`` fails to import, removed when the test session ends."""
    folder = Path(tempfile.mkdtemp(prefix="advpt-test-no-mlflow-"))
    (folder / "mlflow").mkdir()
    (folder / "mlflow" / "__init__.py").write_text("raise ImportError('hidden from child jobs')\n")
    atexit.register(shutil.rmtree, folder, True)
    return str(folder)


@contextlib.contextmanager
def shared_by_workers(name: str):
    """The folder ``name`` of this test run's folder, shared by its pytest-xdist workers
    (``tests/conftest.py``), held under an exclusive lock while the ``with`` block makes or
    finds what is in it: the first worker there makes it, the others wait and find it made."""
    folder = Path(os.environ["ADVPT_TEST_RUN_FOLDER"]) / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f"{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def child_env() -> dict[str, str]:
    """Environment for a child job: CPU accelerator, one thread per process (2 cores are shared
    by every rank and the test runner), and none of the test session's process-group variables.

    ``mlflow`` is hidden from it: ``import deepspeed`` imports it when installed (for its
    autotuner, which no test uses), a third of the 5 s of CPU every fresh interpreter spends on
    importing DeepSpeed, and the suite starts hundreds. No child job uses ``--tracker mlflow``.
    """
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_mlflow_hidden(), env.get("PYTHONPATH")]))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(key, None)
    env.pop("MASTER_PORT", None)
    return env


class Finished(NamedTuple):
    """How a command run in this process ended: as much of a ``CompletedProcess`` as tests read."""

    returncode: int
    stdout: str
    stderr: str


def run_in_process(args: list[str], timeout: float = 600, module: str = "advpt.train") -> Finished:
    """``python -m MODULE ARGS`` as its ``main`` in this process, for ``run_module``'s callers:
    what a fresh process would exit with and print (``timeout`` is not enforced here)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = importlib.import_module(module).main(args)
    return Finished(code, out.getvalue(), err.getvalue())


@starts_process
def run_module(
    args: list[str], timeout: float = 600, module: str = "advpt.train"
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a fresh single process on the CPU accelerator."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def load_script(name: str) -> types.ModuleType:
    """``scripts/NAME.py`` as a module, its ``main(argv)`` and helpers to call in this process."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def refused_by_script(name: str, *flags: str) -> str:
    """``python scripts/NAME.py FLAGS`` in a fresh process, which must refuse them as a user sees
    it: exit code 2, no traceback, and one line saying why, last on standard error (argparse's
    usage before it, for argparse's own checks); that line."""
    done = subprocess.run(
        [sys.executable, f"scripts/{name}.py", *flags],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "error:" in line]
    assert said == done.stderr.splitlines()[-1:], done.stderr[-3000:]
    return said[0]


# A test of a command's ending (its exit code, its one-sentence error) run both ways: in this
# process for the fast tier, and in a fresh one, as users run it, for the process tier.
IN_AND_OUT_OF_PROCESS = pytest.mark.parametrize(
    "run", [run_in_process, run_module], ids=["in_process", "fresh_process"]
)


@starts_ranks
def launcher_command(args: list[str], ranks: int = 2, script: str = "advpt/train.py") -> list[str]:
    """The deepspeed launcher running ``script ARGS`` as ``ranks`` CPU ranks."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    assert launcher, "the deepspeed launcher is installed with advpt"
    return [launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()), script, *args]


@starts_ranks
def launch(
    args: list[str], ranks: int = 2, timeout: float = 600, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """Run ``advpt/train.py ARGS`` through the deepspeed launcher in ``cwd`` and wait for it."""
    return subprocess.run(
        launcher_command(args, ranks, str(REPO / "advpt" / "train.py")),
        cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@starts_ranks
def launch_as_torchrun(
    args: list[str], ranks: int = 2, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run ``python -m advpt.train ARGS`` as ``ranks`` processes with the environment torchrun
    gives its workers, and wait for them: a job of as many ranks as :func:`launch` starts, with
    no launcher process (two fewer fresh interpreters), for tests of what the ranks do rather
    than of the launcher. The ranks' outputs joined in rank order; the first non-zero exit."""
    job = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    with contextlib.ExitStack() as stack:
        # files, not pipes: a rank blocked on a full pipe would hold up the others' collectives
        def log():
            return stack.enter_context(tempfile.TemporaryFile("w+"))

        logs = [(log(), log()) for _ in range(ranks)]  # each rank's stdout and stderr
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "advpt.train", *args],
                cwd=REPO,
                stdout=out,
                stderr=err,
                env=child_env() | job | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
                text=True,
            )
            for rank, (out, err) in enumerate(logs)
        ]
        stack.callback(lambda: [process.kill() for process in processes])
        codes = [process.wait(timeout=timeout) for process in processes]
        stdout, stderr = ("".join(_text(pair[i]) for pair in logs) for i in (0, 1))
    code = next((code for code in codes if code), 0)
    return subprocess.CompletedProcess(processes[0].args, code, stdout, stderr)


def _text(file: io.TextIOBase) -> str:
    file.seek(0)
    return file.read()


def without_wall_clock(records: list[dict]) -> list[dict]:
    """Logged rows without what depends on the wall clock: what a resumed run must reproduce."""
    from advpt.training.reporting.monitor import WALL_CLOCK_KEYS

    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def save_tiny_esm(path: Path, seed: int = 0, **config_changes):
    """A random ``transformers`` EsmForMaskedLM of esm2_tiny's shape, saved to ``path`` by
    transformers itself (nothing fetched); returns the model, in eval mode.

    Every weight is perturbed (LayerNorms and biases are not left at ones and zeros) and the
    rotary frequencies are fp16-rounded, as in the published ESM-2 checkpoints.
    """
    import torch
    from transformers import EsmConfig, EsmForMaskedLM

    from advpt.models import ENCODER_PRESETS

    cfg = ENCODER_PRESETS["esm2_tiny"]
    settings = dict(
        vocab_size=33, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        position_embedding_type="rotary", token_dropout=True, pad_token_id=1, mask_token_id=32,
        emb_layer_norm_before=False, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = EsmForMaskedLM(EsmConfig(**(settings | config_changes))).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
        if model.esm.rotary_embeddings is not None:  # None: learned positions (ESM-1b)
            inv_freq = model.esm.rotary_embeddings.inv_freq
            inv_freq.copy_(inv_freq.half().float())
    model.save_pretrained(path)
    return model


def start_module(args: list[str], module: str) -> subprocess.Popen:
    """``python -m MODULE ARGS`` started (not waited for) as a fresh single CPU process."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_until(job: subprocess.Popen, condition, what: str, timeout: float = 300) -> None:
    """Wait until ``condition()`` holds while ``job`` still runs; ``what`` names the moment."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, f"ended before {what}:\n{job.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"never reached {what}"
        time.sleep(0.02)


def holds_open(job: subprocess.Popen, path: Path) -> bool:
    """Whether process ``job`` has ``path`` open now (Linux: its ``/proc/PID/fd`` links)."""
    links = []
    for fd in Path(f"/proc/{job.pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            links.append(os.readlink(fd))
    return str(path) in links


def stopped_as_promised(job: subprocess.Popen, stop: signal.Signals) -> None:
    """``job``, sent ``stop``, ends as a stop signal promises: 75 and one sentence (SIGINT: 130,
    interrupted), no traceback."""
    job.send_signal(stop)
    _, err = job.communicate(timeout=120)
    interrupted = stop == signal.SIGINT
    assert job.returncode == (130 if interrupted else 75), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = "interrupted" if interrupted else f"stopped by {stop.name}; nothing was kept"
    assert err.strip().splitlines()[-1] == f"advpt: error: {said}"
