"""Rank discovery under every launcher (advpt.launch), real srun-style and torchrun
jobs of two processes, and the shipped Slurm scripts."""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.errors import ConfigError
from advpt.launch import MPI_DEFAULT_PORT, Launch, discover, expand_hostlist, slurm_port
from tests.helpers import REPO, child_env, read_metrics, run_module, tiny_run_args

# --- Slurm host lists ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[09-10]", ["r1n09", "r1n10", "r2n09", "r2n10"]),
        ("rack-a[3,1]-ib,login", ["rack-a3-ib", "rack-a1-ib", "login"]),
        ("gpu-007", ["gpu-007"]),
        (" a , b[2] ", ["a", "b2"]),
    ],
)
def test_hostlists_expand_as_slurm_writes_them(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    "hostlist, why",
    [
        ("gpu[01-04", "never closed"),
        ("gpu01-04]", "unbalanced"),
        ("gpu[[1]]", "unbalanced"),
        ("gpu[a-b]", "not a number"),
        ("gpu[1-]", "not a number"),
        ("gpu[4-1]", "descending"),
        ("a,,b", "empty host"),
        ("", "empty host"),
    ],
)
def test_malformed_hostlists_say_what_is_wrong(hostlist, why):
    with pytest.raises(ValueError, match=why):
        expand_hostlist(hostlist)


# --- which launcher, in which order ----------------------------------------------------------

SRUN = {  # task 1 of a 4-task step over two nodes, as srun sets it
    "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NODEID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[01-08]",
}  # fmt: skip
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node1", "MASTER_PORT": "29400",
}  # fmt: skip
MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}  # fmt: skip


def test_torch_variables_win_over_slurm_and_mpi():
    """``srun torchrun ...`` gives torchrun's workers both: the torch variables are theirs."""
    launch = discover({**SRUN, **MPIRUN, **TORCHRUN})
    assert launch == Launch("torchrun", 3, 8, 1, 4, "node1", 29400)
    assert launch.environ() == {
        "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node1", "MASTER_PORT": "29400",
    }  # fmt: skip


def test_the_deepspeed_launcher_is_named_and_gives_its_local_size():
    env = {key: TORCHRUN[key] for key in TORCHRUN if key not in ("TORCHELASTIC_RUN_ID",)}
    env = {**env, "CROSS_RANK": "0", "LOCAL_SIZE": "2"}
    del env["LOCAL_WORLD_SIZE"]
    launch = discover(env)
    assert (launch.launcher, launch.local_world) == ("deepspeed", 2)
    assert "--master_port 4242" in launch.port_advice(4242)
    del env["CROSS_RANK"], env["LOCAL_SIZE"]  # variables set by hand
    assert discover(env) == Launch("env://", 3, 8, 1, None, "node1", 29400)
    assert "LOCAL_WORLD_SIZE" not in discover(env).environ()


def test_srun_tasks_meet_on_the_first_host_of_their_step_at_a_port_of_the_job():
    launch = discover({**SRUN, **MPIRUN})
    assert launch == Launch("srun", 1, 4, 1, 2, "gpu07", slurm_port(123456, 0))
    assert launch.describe() == (
        f"launcher: srun, 4 rank(s), 2 on this node, meeting at gpu07:{slurm_port(123456, 0)}"
    )
    assert "MASTER_PORT=4242" in launch.port_advice(4242)
    # the job's list when the step's is missing; MASTER_ADDR and MASTER_PORT win when set
    no_step_list = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_NODELIST"}
    assert discover(no_step_list).master_addr == "gpu01"
    given = discover({**SRUN, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "20001"})
    assert (given.master_addr, given.master_port) == ("10.0.0.9", 20001)
    # uneven nodes: the third node of "4(x2),3" runs 3 tasks
    uneven = {**SRUN, "SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}
    assert discover({**uneven, "SLURM_NTASKS": "11", "SLURM_STEP_NUM_TASKS": "11"}).local_world == 3


def test_slurm_ports_stay_below_the_ephemeral_range_and_differ_between_neighbours():
    ports = {slurm_port(job, step) for job in range(10_000, 10_500) for step in range(4)}
    assert len(ports) == 2000
    assert min(ports) >= 15000 and max(ports) < 32000


def test_a_batch_or_salloc_shell_without_srun_is_one_process():
    """``sbatch --ntasks 8`` runs its script once, with SLURM_NTASKS=8 and SLURM_PROCID=0 but no
    step id: python started there is one process, not one of 8."""
    shell = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    launch = discover({**shell, "SLURM_PROCID": "0", "SLURM_NTASKS": "8"})
    assert (launch.launcher, launch.world, launch.rank) == ("none", 1, 0)
    assert launch.master_addr == "127.0.0.1" and launch.master_port > 0
    assert discover({}).describe() == "no launcher found: one process"
    for step in ("extern", "-6", "4294967291"):  # no numbered step (the last: batch, unsigned)
        assert discover({**SRUN, "SLURM_STEP_ID": step}).launcher == "none"


def test_a_one_task_srun_step_is_one_process():
    launch = discover(
        {**SRUN, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}
    )
    assert (launch.launcher, launch.world, launch.master_addr) == ("srun", 1, "127.0.0.1")


def test_mpirun_needs_master_addr_unless_every_rank_is_local():
    local = {**MPIRUN, "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert discover(local) == Launch("mpirun", 2, 4, 0, 4, "127.0.0.1", MPI_DEFAULT_PORT)
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set"):
        discover(MPIRUN)
    launch = discover({**MPIRUN, "MASTER_ADDR": "node1", "MASTER_PORT": "20002"})
    assert (launch.master_addr, launch.master_port, launch.local_world) == ("node1", 20002, 2)


@pytest.mark.parametrize(
    "env, says",
    [
        ({**SRUN, "SLURM_PROCID": None}, "SLURM_STEP_NUM_TASKS=4 .* but SLURM_PROCID is not"),
        ({**SRUN, "SLURM_LOCALID": None}, "SLURM_LOCALID is not"),
        ({**SRUN, "SLURM_STEP_NUM_TASKS": None, "SLURM_PROCID": None}, "SLURM_NTASKS=4"),
        ({**SRUN, "SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not a rank of a world of 4"),
        ({**SRUN, "SLURM_STEP_NODELIST": "gpu[07"}, "SLURM_STEP_NODELIST='gpu\\[07' is not"),
        ({**SRUN, "SLURM_STEP_NODELIST": None, "SLURM_NODELIST": None}, "or MASTER_ADDR is set"),
        ({**SRUN, "SLURM_JOB_ID": None}, "SLURM_JOB_ID is not"),
        ({**MPIRUN, "OMPI_COMM_WORLD_RANK": None}, "OMPI_COMM_WORLD_RANK is not"),
        ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
        ({**TORCHRUN, "MASTER_PORT": None}, "WORLD_SIZE=8 but MASTER_PORT is not"),
        ({**TORCHRUN, "RANK": "x"}, "RANK='x' is not a whole number"),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
        ({**TORCHRUN, "RANK": "-1"}, "RANK='-1' is not a whole number"),
        ({**TORCHRUN, "RANK": "\u00b2"}, "RANK='\u00b2' is not a whole number"),  # isdigit()
        ({**TORCHRUN, "LOCAL_RANK": "1.5"}, "LOCAL_RANK='1.5' is not a whole number"),
        ({**TORCHRUN, "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE='999.* is above 2147483647"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
        ({**TORCHRUN, "MASTER_PORT": "0"}, "MASTER_PORT=0 is not a TCP port"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not a whole number"),
        ({**SRUN, "SLURM_JOB_ID": "nan"}, "SLURM_JOB_ID='nan' is not a whole number"),
        ({**SRUN, "SLURM_STEP_NUM_TASKS": "inf"}, "SLURM_STEP_NUM_TASKS='inf' is not a whole"),
        ({**MPIRUN, "OMPI_COMM_WORLD_SIZE": "-4"}, "SIZE='-4' is not a whole number"),
        ({**MPIRUN, "OMPI_COMM_WORLD_LOCAL_SIZE": "x"}, "LOCAL_SIZE='x' is not a whole number"),
    ],
)
def test_several_tasks_that_cannot_be_placed_are_one_sentence(env, says):
    env = {key: value for key, value in env.items() if value is not None}
    with pytest.raises(ConfigError, match=says) as error:
        discover(env)
    assert "\n" not in str(error.value)


# --- real jobs --------------------------------------------------------------------------------

LAUNCH_VARIABLES = ("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "CROSS_", "LOCAL_SIZE")


def job_env(**variables: str) -> dict[str, str]:
    """A child's environment with no launcher's variables but ``variables``."""
    env = {k: v for k, v in child_env().items() if not k.startswith(LAUNCH_VARIABLES)}
    return {**env, **variables}


def free_slurm_job_id() -> int:
    """A job id whose srun port (step 0) is free on this machine now."""
    for job_id in range(os.getpid() % 17000, 17000 * 10, 7919):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", slurm_port(job_id, 0)))
            except OSError:
                continue
        return job_id
    raise AssertionError("no free port in the srun range")


def short_run(tmp_path: Path, run_dir: Path, world: int) -> list[str]:
    args = tiny_run_args(tmp_path, run_dir, world=world)
    return [*args, "--mode", "random", "--max_steps", "2", "--log_every", "1", "--num_workers", "0"]


@pytest.mark.slow
def test_two_srun_tasks_form_one_two_rank_job(tmp_path):
    """Two processes with the variables srun gives the tasks of a 2-task step (and no RANK)
    train as ranks 0 and 1 of one job: one batch line counting 2 ranks, one metrics file,
    one summary."""
    host = socket.gethostname()
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        pytest.skip(f"this machine's host name {host} does not resolve")
    run_dir = tmp_path / "run"
    args = short_run(tmp_path, run_dir, world=2)
    common = dict(
        SLURM_JOB_ID=str(free_slurm_job_id()), SLURM_STEP_ID="0", SLURM_NTASKS="2",
        SLURM_STEP_NUM_TASKS="2", SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_STEP_NODELIST=host, SLURM_NODELIST=host,
    )  # fmt: skip
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "advpt.train", *args],
            cwd=REPO,
            env=job_env(**common, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [task.communicate(timeout=600)[0] for task in tasks]
    for task, out in zip(tasks, outputs, strict=True):
        assert task.returncode == 0, out[-4000:]
    first, second = outputs
    assert "[advpt] launcher: srun, 2 rank(s), 2 on this node, meeting at " + host in first
    batch = "[advpt] global batch 16 sequences = micro-batch 8 x 1 accumulation step(s) x 2 rank(s)"
    assert first.count(batch) == 1
    assert "global batch" not in second and "launcher" not in second
    records = read_metrics(run_dir)
    assert records[-1]["encoder_step"] == 2 and "val_loss" in records[-1]
    assert {r["encoder_batch_size"] for r in records if "encoder_batch_size" in r} == {16}
    assert first.count(str(run_dir / "metrics.jsonl")) == 1


def test_an_incomplete_srun_environment_is_refused_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    env = job_env(SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_NTASKS="2", SLURM_NODELIST="n1")
    result = subprocess.run(
        [sys.executable, "-m", "advpt.train", *short_run(tmp_path, run_dir, world=2)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("advpt: error:")]
    assert errors == [
        "advpt: error: SLURM_STEP_ID is set and SLURM_NTASKS=2 (a task of an srun step) but "
        "SLURM_PROCID and SLURM_LOCALID are not: cannot tell this process's place in the job"
    ]
    assert "Traceback" not in result.stderr
    assert not run_dir.exists()


# Launch variables a broken cluster or a stale shell leaves, and the sentence (a pattern) each
# ends in.
HOSTILE_ENVIRONMENTS = {
    "rank not a number": (
        dict(RANK="abc", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
        "environment variable RANK='abc' is not a whole number",
    ),
    "rank of no world": (  # rank 1 must print it: it is its own error
        dict(RANK="1", WORLD_SIZE="1"),
        "environment variable RANK=1 is not a rank of a world of 1",
    ),
    "rank without a world": (
        dict(RANK="1"),
        "RANK is set but WORLD_SIZE is not: cannot tell this process's place in the job",
    ),
    "port past 65535": (
        dict(MASTER_PORT="70000"),
        r"environment variable MASTER_PORT=70000 is not a TCP port \(1-65535\)",
    ),
    "stale host": (  # torch would retry it for 30 minutes, deaf to SIGTERM
        dict(MASTER_ADDR="stale-node.invalid", ADVPT_RENDEZVOUS_TIMEOUT="20"),
        "environment variable MASTER_ADDR='stale-node.invalid' (does not resolve|did not resolve "
        "within 20 s)",
    ),
    "timeout not a number": (
        dict(ADVPT_RENDEZVOUS_TIMEOUT="nan"),
        "environment variable ADVPT_RENDEZVOUS_TIMEOUT='nan' is not a positive number of seconds",
    ),
}


@pytest.mark.process
@pytest.mark.parametrize("case", sorted(HOSTILE_ENVIRONMENTS))
def test_hostile_launch_variables_are_one_sentence_before_anything_is_written(tmp_path, case):
    variables, says = HOSTILE_ENVIRONMENTS[case]
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "advpt.train", *short_run(tmp_path, run_dir, world=1)],
        cwd=REPO, env=job_env(**variables), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    assert re.fullmatch(f"advpt: error: {says}.*", result.stderr.strip().splitlines()[-1])
    assert not run_dir.exists()


def test_plain_python_is_one_process_and_resume_in_an_empty_run_dir_starts_fresh(tmp_path):
    """What the Slurm scripts rely on: they always pass --resume."""
    run_dir = tmp_path / "run"
    result = run_module([*short_run(tmp_path, run_dir, world=1), "--resume"])
    assert result.returncode == 0, result.stderr[-4000:]
    assert "[advpt] no launcher found: one process" in result.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 2]


@pytest.mark.slow
def test_torchrun_with_two_processes_trains(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun is installed with torch"
    run_dir = tmp_path / "run"
    command = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "advpt.train"]
    result = subprocess.run(
        [*command, *short_run(tmp_path, run_dir, world=2)],
        cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert out.count("[advpt] launcher: torchrun, 2 rank(s), 2 on this node") == 1
    assert out.count("x 2 rank(s), for the whole run") == 1
    records = read_metrics(run_dir)
    assert {r["encoder_batch_size"] for r in records if "encoder_batch_size" in r} == {16}


# --- the shipped Slurm scripts ----------------------------------------------------------------

SLURM_SCRIPTS = sorted((REPO / "scripts" / "slurm").iterdir())


def test_the_slurm_scripts_are_valid_bash():
    assert {p.name for p in SLURM_SCRIPTS} >= {
        "pretrain-1node.sbatch", "pretrain-multinode.sbatch", "pretrain.sh"
    }  # fmt: skip
    for script in SLURM_SCRIPTS:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


def advpt_train_commands(script: Path) -> list[list[str]]:
    """The arguments of each ``python -m advpt.train`` in ``script``, continuation lines joined,
    shell variables given sample values."""
    text = script.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if "-m advpt.train" in line:
            words = shlex.split(line.split("-m advpt.train", 1)[1], comments=True)
            words = [w for w in words if w not in ("&", "$@")]
            commands.append([os.path.expandvars(w) for w in words])
    return commands


def test_every_flag_the_slurm_scripts_pass_is_an_advpt_train_flag(monkeypatch):
    monkeypatch.setenv("DATA", "uniref50.fasta.gz")
    monkeypatch.setenv("RUN_DIR", "runs/adv")
    commands = [c for script in SLURM_SCRIPTS for c in advpt_train_commands(script)]
    assert len(commands) == 1  # in pretrain.sh, run by both sbatch scripts
    config = parse(TrainConfig, commands[0])
    assert config.run.resume and config.dataset.data == "uniref50.fasta.gz"
    recommended = parse(TrainConfig, ["--recipe", "recommended"])
    for section in ("method", "model", "masking"):  # the recommended recipe's, as the README's
        assert getattr(config, section) == getattr(recommended, section), section


def fake_cluster(tmp_path: Path, train_exit: str) -> dict[str, str]:
    """``srun`` (runs its command), ``scontrol`` (logs its arguments) and ``python`` (a
    training that logs its arguments and, on USR1, stops with 75; or exits ``train_exit``)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    scripts = {
        "srun": 'while [[ $1 == -* ]]; do shift; done\nexec "$@"',
        "scontrol": f'echo "$@" >> {log}/scontrol',
        "python": (
            f"echo \"$@\" > {log}/args\ntrap 'exit 75' USR1\ntouch {log}/started\n"
            f"[[ -n '{train_exit}' ]] && exit {train_exit or 0}\n"
            "for i in $(seq 600); do sleep 0.1; done"
        ),
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {
        **job_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
        "SLURM_SUBMIT_DIR": str(REPO), "DATA": "data.fasta", "TMPDIR": str(tmp_path),
    }  # fmt: skip


@pytest.mark.parametrize("script", ["pretrain-1node.sbatch", "pretrain-multinode.sbatch"])
def test_usr1_to_the_batch_shell_stops_the_step_and_requeues_the_job(tmp_path, script):
    """What Slurm does near the time limit (``--signal=B:USR1@300``), with stand-ins for srun,
    scontrol and the training: the shell forwards USR1, the step exits 75, the job is requeued."""
    env, log = fake_cluster(tmp_path, train_exit=""), tmp_path / "log"
    shell = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "slurm" / script), "--max_steps", "9"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    for _ in range(300):
        if (log / "started").exists():
            break
        time.sleep(0.1)
    shell.send_signal(signal.SIGUSR1)
    out = shell.communicate(timeout=60)[0]
    assert shell.returncode == 0, out
    assert (log / "scontrol").read_text() == "requeue 42\n"
    args = (log / "args").read_text().split()
    assert args[:2] == ["-m", "advpt.train"] and args[-3:] == ["--resume", "--max_steps", "9"]
    assert "time limit near" in out and "requeueing job 42" in out


@pytest.mark.parametrize("code", ["0", "2"])
def test_a_step_that_ends_otherwise_is_not_requeued(tmp_path, code):
    env = fake_cluster(tmp_path, train_exit=code)
    script = REPO / "scripts" / "slurm" / "pretrain-1node.sbatch"
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == int(code), result.stdout + result.stderr
    assert not (tmp_path / "log" / "scontrol").exists()


def test_an_error_every_srun_task_meets_is_printed_by_task_0_alone(tmp_path):
    """A bad flag fails on every task before any process group exists; the rank that decides
    who prints is srun's (SLURM_PROCID), as it is torchrun's RANK: one sentence per job."""
    common = dict(
        SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
        SLURM_NODEID="0", SLURM_STEP_NODELIST="n1", SLURM_NODELIST="n1",
    )  # fmt: skip
    args = [*short_run(tmp_path, tmp_path / "run", world=2), "--max_steps", "-1"]
    env = [job_env(**common, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)) for i in range(2)]
    command = [sys.executable, "-m", "advpt.train", *args]
    stderr = [
        subprocess.run(command, cwd=REPO, env=e, capture_output=True, text=True, timeout=300).stderr
        for e in env
    ]
    assert "advpt: error: " in stderr[0] and "max_steps" in stderr[0], stderr[0][-2000:]
    assert "advpt: error" not in stderr[1], stderr[1][-2000:]
