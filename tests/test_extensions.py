"""No advpt process ever waits silently on a C++ op's build lock (advpt/native_builds.py).

The commands run in a second Python environment made here, a virtual environment whose site
reads this one's packages, as a user's second environment would: its ops build into its own
folder, and the op this environment built is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import venv
from pathlib import Path

import pytest

from advpt import native_builds
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
    env.pop(native_builds.ENV, None)
    env.pop("ADVPT_OWN_EXTENSIONS_DIR", None)
    return env | extra


@starts_process
def _start(python: Path, args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """``python args`` in a session of its own, standard error to ``log``."""
    return subprocess.Popen(
        [str(python), *args], cwd=REPO, env=_env(**env), stdout=subprocess.DEVNULL,
        stderr=log.open("w"), text=True, start_new_session=True,
    )  # fmt: skip


def _build_extensions(folder: Path) -> subprocess.CompletedProcess:
    """``python -m advpt.build_extensions`` with ``TORCH_EXTENSIONS_DIR=folder``, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "advpt.build_extensions"], cwd=REPO,
        env=_env(TORCH_EXTENSIONS_DIR=str(folder)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def immutable():
    """``immutable(path)``: ``path`` made immutable (``chattr +i``; the tests run as root, whom a
    permission bit would not stop), mutable again afterwards."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if shutil.which("chattr") is None:
            pytest.skip("no chattr command: no file or folder root may not write can be made")
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a file immutable here: {done.stderr.strip()}")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


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
        [str(second_env), "-c",
         "from advpt.native_builds import extensions_folder as f; print(f())"],
        env=_env(), capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(theirs) == second_env.parent.parent / "var" / "advpt" / "torch_extensions"
    assert Path(theirs) != native_builds.extensions_folder()


def _a_killed_build_is_cleared_by_the_next(
    python: Path, first: list[str], then: list[str], folder: Path, tmp_path: Path, **env: str
) -> None:
    """``python first`` SIGKILLed while it builds the op in ``folder`` leaves torch's lock;
    ``python then`` removes it at once, saying so, and builds; SIGTERM ends that build with
    exit 75 and one sentence, leaving no lock."""
    lock = folder / OP / "lock"
    killed = _start(python, first, tmp_path / "killed.log", **env)
    try:
        wait_until(killed, lock.exists, "the build's lock", timeout=120)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert lock.exists(), "a build killed by SIGKILL leaves torch's lock"

    log = tmp_path / "again.log"
    again = _start(python, then, log, **env)
    wait_until(again, lambda: lock.exists() and holds_open(again, lock), "a new build", 120)
    assert f"removed {lock}, left by a build of {OP} that was killed" in log.read_text()
    _stops_with_one_sentence(again, log)
    assert not lock.exists()


def test_a_start_after_a_build_killed_by_sigkill_removes_its_lock_and_builds(second_env, tmp_path):
    """The issue's reproduction: ``advpt.train`` SIGKILLed while DeepSpeed builds its CPU op
    leaves torch's lock, which the next start removes."""
    folder = second_env.parent.parent / "var" / "advpt" / "torch_extensions"
    train = ["-m", "advpt.train", "--max_steps", "2"]
    first, then = ([*train, *tiny_run_args(tmp_path, tmp_path / run)] for run in "ab")
    _a_killed_build_is_cleared_by_the_next(second_env, first, then, folder, tmp_path)


def test_in_a_folder_the_user_named_a_lock_advpts_killed_build_left_is_removed_at_once(tmp_path):
    """A first build killed by SIGKILL there (Slurm's time limit) leaves torch's lock and advpt's
    record of that build, naming a process of this host that is gone: the lock is that build's,
    removed at once, not waited on for ``STALE_S``."""
    folder = tmp_path / "user-extensions"
    build = ["-m", "advpt.build_extensions"]
    python = Path(sys.executable)
    _a_killed_build_is_cleared_by_the_next(
        python, build, build, folder, tmp_path, TORCH_EXTENSIONS_DIR=str(folder)
    )


def test_a_start_while_another_advpt_process_builds_says_whom_it_waits_for(
    second_env, tmp_path, monkeypatch
):
    folder = second_env.parent.parent / "var" / "advpt" / "torch_extensions"
    log = tmp_path / "waiting.log"
    monkeypatch.setenv(native_builds.ENV, str(folder))  # this process takes that folder's lock
    with native_builds.building(OP):
        job = _start(second_env, ["-m", "advpt.build_extensions"], log)
        said = f"[advpt] waiting for another advpt process (pid {os.getpid()} on "
        wait_until(job, lambda: said in log.read_text(), "the wait's announcement", 120)
        _stops_with_one_sentence(job, log)


def test_in_a_folder_the_user_named_a_lock_is_waited_on_until_it_is_stale(tmp_path):
    """Another program may build there, or advpt on another host (whose process this one cannot
    see): a fresh lock is waited on, saying which file to delete; one older than STALE_S is a
    dead build's, removed."""
    folder = tmp_path / "user-extensions"
    lock = folder / OP / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    # no pid reaches 2**22 (Linux's PID_MAX_LIMIT): gone, were it of this host
    (folder / f"{OP}.advpt-lock").write_text(f"pid {2**22} on another-host\n")
    log = tmp_path / "user.log"
    python = Path(sys.executable)
    job = _start(python, ["-m", "advpt.build_extensions"], log, TORCH_EXTENSIONS_DIR=str(folder))
    said = f"delete {lock} if nothing is building"
    wait_until(job, lambda: said in log.read_text(), "the wait's announcement", 120)
    _stops_with_one_sentence(job, log)
    assert lock.exists(), "a lock that may be live is left alone"

    stale = time.time() - native_builds.STALE_S - 60
    os.utime(lock, (stale, stale))
    job = _start(python, ["-m", "advpt.build_extensions"], log, TORCH_EXTENSIONS_DIR=str(folder))
    wait_until(job, lambda: lock.exists() and holds_open(job, lock), "a new build", 120)
    _stops_with_one_sentence(job, log)
    assert not lock.exists()


def test_a_lock_holder_is_named_as_it_wrote_itself_down_whatever_its_bytes(tmp_path):
    """A record of no UTF-8 text, with a terminal control sequence, is named escaped."""
    folder = tmp_path / "user-extensions"
    folder.mkdir()
    log = tmp_path / "waiting.log"
    with open(folder / f"{OP}.advpt-lock", "wb") as lock:
        lock.write(b"\xff\xfe\x1b[2J\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = ["-m", "advpt.build_extensions"]
        job = _start(Path(sys.executable), build, log, TORCH_EXTENSIONS_DIR=str(folder))
        said = "[advpt] waiting for another advpt process ('\\ufffd\\ufffd\\x1b[2J') to build "
        wait_until(job, lambda: said in log.read_text(), "the wait's announcement", 120)
        _stops_with_one_sentence(job, log)


@pytest.mark.parametrize("case", ["a file", "a folder it may not write", "a lock that is a folder"])
def test_an_extensions_folder_advpt_cannot_use_is_one_sentence(tmp_path, immutable, case):
    folder = tmp_path / "extensions"
    lock = folder / f"{OP}.advpt-lock"
    if case == "a file":
        folder.write_text("not a folder\n")
        what = f"{folder} is not a folder"
    elif case == "a folder it may not write":
        folder.mkdir()
        immutable(folder)
        what = f"{lock}: Operation not permitted"  # a user other than root: Permission denied
    else:
        lock.mkdir(parents=True)
        what = f"{lock}: Is a directory"
    before = sorted(tmp_path.rglob("*"))
    done = _build_extensions(folder)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    said = f"advpt: error: cannot build {OP} in TORCH_EXTENSIONS_DIR {folder}: {what}"
    assert done.stderr.strip().splitlines()[-1] == said
    assert sorted(tmp_path.rglob("*")) == before


def test_an_op_built_beside_a_lock_advpt_may_not_write_loads(tmp_path, immutable):
    """A lock file someone else made is locked read-only: the op built there loads."""
    folder = tmp_path / "extensions"
    shutil.copytree(native_builds.extensions_folder() / OP, folder / OP)  # built at set-up
    lock = folder / f"{OP}.advpt-lock"
    lock.touch()
    immutable(lock)
    done = _build_extensions(folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"[advpt] {OP} built in {folder}\n"


def test_the_adam_op_a_deepspeed_json_builds_is_built_under_advpts_lock():
    """``build_engine`` builds the op DeepSpeed's optimizer would compile inside
    ``deepspeed.initialize`` first, under :func:`advpt.native_builds.building`."""
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
    monkeypatch.setenv(native_builds.ENV, str(tmp_path))
    built = []

    def build() -> None:
        with native_builds.building("op") as folder:
            built.append(folder)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert built == [tmp_path / "op"]
    assert (tmp_path / "op.advpt-lock").exists()


PROBE_BUILD = """
import sys
from torch.utils import cpp_extension
from advpt.native_builds import building
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
