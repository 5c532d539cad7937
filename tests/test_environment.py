"""The one environment report (advpt.environment): what the benchmarks store beside their
numbers, and what the GPU check, the study and the quickstart print."""

import json
import platform

import torch

from advpt.environment import describe, device_name, environment
from tests.helpers import REPO, run_in_process


def test_the_report_names_this_machine_and_its_software():
    info = environment(torch.device("cpu"), commit="abc1234")
    assert info["device"] == device_name("cpu") == "CPU"
    assert info["python"] == platform.python_version() and info["torch"] == torch.__version__
    assert info["threads"] == torch.get_num_threads() and info["commit"] == "abc1234"
    assert info["deepspeed"][0].isdigit()  # a version, not "not importable"
    line = describe(info)
    assert line.startswith("CPU (") and f"torch {torch.__version__}" in line
    assert "advpt abc1234" in line and "deepspeed " in line


def test_a_stored_report_of_another_time_is_read_with_what_it_lacks_marked():
    """gpu_report renders environments written by older checks, which lack newer keys."""
    line = describe({"device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"})
    assert line.startswith("NVIDIA H200 (? GPU(s), ? cores") and "(CUDA 13.0)" in line


def test_the_command_prints_one_line_and_writes_the_json(tmp_path):
    done = run_in_process(["--json", str(tmp_path / "env.json"), "--commit", "feed123",
                           "--device", "cpu"], module="advpt.environment.__main__")  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = json.loads((tmp_path / "env.json").read_text())
    assert done.stdout == describe(stored) + "\n" and stored["commit"] == "feed123"
    assert [p.name for p in tmp_path.iterdir()] == ["env.json"]  # no staging file left
    folder = run_in_process(["--json", str(tmp_path)], module="advpt.environment.__main__")
    assert folder.returncode == 2
    assert (
        folder.stderr.strip()
        == f"advpt: error: --json {tmp_path} is a folder; name the file to write"
    )
    gone = run_in_process(
        ["--json", str(tmp_path / "no" / "e.json")], module="advpt.environment.__main__"
    )
    assert gone.returncode != 0 and f"cannot write {tmp_path / 'no' / 'e.json'}: " in gone.stderr
    wrong = run_in_process(["--device", "gpu"], module="advpt.environment.__main__")
    assert wrong.returncode == 2 and "--device 'gpu' is not a device" in wrong.stderr
    assert environment()["commit"] != "unknown" or not (REPO / ".git").exists()
