"""No advpt process ever waits silently on a C++ op's build lock (advpt/extensions.py).

The commands run in a second Python environment made here, a virtual environment whose site
reads this one's packages, as a user's second environment would: its ops build into its own
folder, and the op this environment built is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import venv
from pathlib import Path

import pytest

from advpt import extensions
from tests.helpers import (
    REPO,
    child_env,
    holds_open,
    tiny_run_args,
    wait_until,
)
from tests.tiers import starts_process

OP = "deepspeed_shm_comm"


@pytest.fixture
def second_env(tmp_path: Path) -> Path:
    """The python of a new environment on top of this one's packages."""
    root = tmp_path / "second-env"
    venv.create(root, with_pip=False)
    site = next((root / "lib").glob("python3*/site-packages"))
    here = sysconfig.get_paths()["purelib"]
    (site / "advpt_test_base.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return root / "bin" / "python"


def _env(**extra: str) -> dict[str, str]:
    """A child's environment with no extensions folder chosen, unless ``extra`` names one."""
    env = child_env()
    env.pop(extensions.ENV, None)
    env.pop("ADVPT_OWN_EXTENSIONS_DIR", None)
    return env | extra


@starts_process
def _start(python: Path, args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """``python args`` in a session of its own, standard error to ``log``."""
    return subprocess.Popen(
        [str(python), *args], cwd=REPO, env=_env(**env), stdout=subprocess.DEVNULL,
        stderr=log.open("w"), text=True, start_new_session=True,
    )  # fmt: skip


def _end_session(job: subprocess.Popen) -> None:
    """Kill what is left of ``job``'s session (a compiler the build had started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)


def _stops_with_one_sentence(job: subprocess.Popen, log: Path) -> None:
    """``job``, sent SIGTERM, ends within a bounded time with exit 75 and one sentence."""
    job.send_signal(signal.SIGTERM)
    try:
        job.wait(timeout=120)
    finally:
        _end_session(job)
    err = log.read_text()
    assert job.returncode == 75, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "advpt: error: stopped by SIGTERM; nothing was kept"


def test_each_environment_builds_into_a_folder_of_its_own(second_env):
    """Two environments never share a build folder, so neither rebuilds the other's op."""
    theirs = subprocess.run(
        [str(second_env), "-c", "from advpt.extensions import extensions_folder as f; print(f())"],
        env=_env(), capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(theirs) == second_env.parent.parent / "var" / "advpt" / "torch_extensions"
    assert Path(theirs) != extensions.extensions_folder()


def test_a_start_after_a_build_killed_by_sigkill_removes_its_lock_and_builds(second_env, tmp_path):
    """The issue's reproduction: ``advpt.train`` SIGKILLed while DeepSpeed builds its CPU op
    leaves torch's lock; the next start removes it and builds, and SIGTERM ends that build with
    exit 75 and one sentence, leaving no lock."""
    folder = second_env.parent.parent / "var" / "advpt" / "torch_extensions"
    lock = folder / OP / "lock"
    train = ["-m", "advpt.train", "--max_steps", "2"]
    first = [*train, *tiny_run_args(tmp_path, tmp_path / "a")]
    killed = _start(second_env, first, tmp_path / "a.log")
    try:
        wait_until(killed, lock.exists, "the build's lock", timeout=120)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert lock.exists(), "a build killed by SIGKILL leaves torch's lock"

    log = tmp_path / "b.log"
    again = _start(second_env, [*train, *tiny_run_args(tmp_path, tmp_path / "b")], log)
    wait_until(again, lambda: lock.exists() and holds_open(again, lock), "a new build", 120)
    assert f"removed {lock}, left by a build of {OP} that was killed" in log.read_text()
    _stops_with_one_sentence(again, log)
    assert not lock.exists()


def test_a_start_while_another_advpt_process_builds_says_whom_it_waits_for(
    second_env, tmp_path, monkeypatch
):
    folder = second_env.parent.parent / "var" / "advpt" / "torch_extensions"
    log = tmp_path / "waiting.log"
    monkeypatch.setenv(extensions.ENV, str(folder))  # this process takes that folder's lock
    with extensions.building(OP):
        job = _start(second_env, ["-m", "advpt.build_extensions"], log)
        said = f"[advpt] waiting for another advpt process (pid {os.getpid()} on "
        wait_until(job, lambda: said in log.read_text(), "the wait's announcement", 120)
        _stops_with_one_sentence(job, log)


def test_in_a_folder_the_user_named_a_lock_is_waited_on_until_it_is_stale(tmp_path):
    """Another program may build there: a fresh lock is waited on, saying which file to delete;
    one older than STALE_S is a dead build's, removed."""
    folder = tmp_path / "user-extensions"
    lock = folder / OP / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    log = tmp_path / "user.log"
    python = Path(sys.executable)
    job = _start(python, ["-m", "advpt.build_extensions"], log, TORCH_EXTENSIONS_DIR=str(folder))
    said = f"delete {lock} if nothing is building"
    wait_until(job, lambda: said in log.read_text(), "the wait's announcement", 120)
    _stops_with_one_sentence(job, log)
    assert lock.exists(), "a lock that may be live is left alone"

    stale = time.time() - extensions.STALE_S - 60
    os.utime(lock, (stale, stale))
    job = _start(python, ["-m", "advpt.build_extensions"], log, TORCH_EXTENSIONS_DIR=str(folder))
    wait_until(job, lambda: lock.exists() and holds_open(job, lock), "a new build", 120)
    _stops_with_one_sentence(job, log)
    assert not lock.exists()


def test_the_adam_op_a_deepspeed_json_builds_is_built_under_advpts_lock():
    """``build_engine`` builds the op DeepSpeed's optimizer would compile inside
    ``deepspeed.initialize`` first, under :func:`advpt.extensions.building`."""
    from advpt.training.engines.engine import adam_op_builder, simple_ds_config

    assert adam_op_builder(simple_ds_config(8, adam="torch")) is None
    assert adam_op_builder(simple_ds_config(8, adam="torch-fused")) is None
    deepspeed_adam = simple_ds_config(8, adam="deepspeed")
    assert adam_op_builder(deepspeed_adam) == "CPUAdamBuilder"  # the CPU accelerator
    lamb = deepspeed_adam | {"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}
    assert adam_op_builder(lamb) is None


def test_a_build_asked_for_by_another_thread_takes_the_lock_too(tmp_path, monkeypatch):
    """Signal handlers can be set from the main thread only: elsewhere the build goes on
    without them instead of failing (which the sampler's loader would take as a failed build)."""
    monkeypatch.setenv(extensions.ENV, str(tmp_path))
    built = []

    def build() -> None:
        with extensions.building("op") as folder:
            built.append(folder)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert built == [tmp_path / "op"]
    assert (tmp_path / "op.advpt-lock").exists()


PROBE_BUILD = """
import sys
from torch.utils import cpp_extension
from advpt.extensions import building
with building("advpt_ninja_probe") as folder:
    cpp_extension.load("advpt_ninja_probe", [sys.argv[1]], is_python_module=False)
"""


def test_every_build_of_an_environment_runs_its_own_ninja(tmp_path):
    """Ninja 1.12 changed how ``.ninja_log`` hashes a command: a Debian ninja 1.11 and pip's
    1.13 each take the other's build for another command's and build again, in turn. Processes
    with and without the environment's ``bin`` on ``PATH`` (as the test suite's are) still run
    one ninja, the environment's, so the op compiles once."""
    scripts = Path(sysconfig.get_path("scripts"))
    assert (scripts / "ninja").is_file(), "DeepSpeed requires pip's ninja"
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" int advpt_ninja_probe() { return 1; }\n')
    env = _env(TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"))
    without = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != scripts)
    # pip's ninja takes over the log Debian's wrote; Debian's, after it, built the op again
    for path in (without, f"{scripts}{os.pathsep}{without}", without):
        done = subprocess.run(
            [sys.executable, "-c", PROBE_BUILD, str(source)], cwd=REPO, env=env | {"PATH": path},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "extensions" / "advpt_ninja_probe" / ".ninja_log").read_text()
    assert [line.split()[3] for line in log.splitlines()[1:]] == ["probe.o", "advpt_ninja_probe.so"]
