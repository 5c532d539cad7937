"""The shipped DeepSpeed JSONs: one copy in the top-level ds_configs/, found by short name from
a checkout and from what pip installs (wheel, sdist), and printed by --print_ds_config."""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from advpt import ds_configs
from advpt.train import main
from tests.helpers import REPO, run_module

TOP_LEVEL = REPO / "ds_configs"
FILES = sorted(TOP_LEVEL.glob("*/*.json"))


def test_the_package_reads_the_top_level_files_in_a_checkout():
    assert ds_configs.SHIPPED.resolve() == TOP_LEVEL.resolve()
    assert sorted(f"{p.parent.name}/{p.stem}" for p in FILES) == sorted(ds_configs.specs())
    assert set(ds_configs.ROLES) == {p.parent.name for p in FILES}


def test_print_ds_config_prints_the_file_to_copy_and_exits_0():
    result = run_module(["--print_ds_config", "encoder/gpu-bf16"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == (TOP_LEVEL / "encoder" / "gpu-bf16.json").read_text()


@pytest.mark.parametrize("spec", ["gpu-bf16", "noiser/gpu-bf16", "../encoder/cpu", "tensorboard/x"])
def test_print_ds_config_of_an_unknown_name_lists_the_shipped_ones(capsys, spec):
    assert main(["--print_ds_config", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"advpt: error: --print_ds_config {spec} is no shipped DeepSpeed config")
    assert all(spec in err for spec in ds_configs.specs())
    assert "Traceback" not in err


def _copy_checkout(dest: Path) -> Path:
    """What a git clone holds of the package: sources, the top-level JSONs and the link."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("advpt", "ds_configs"):
        shutil.copytree(REPO / name, dest / name, symlinks=True, ignore=ignore)
    assert (dest / "advpt" / "ds_configs" / "shipped").is_symlink()
    return dest


def _build(kind: str, source: Path, out: Path) -> Path:
    """Build a wheel or sdist of ``source`` with setuptools, as pip does (no network)."""
    code = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(out)!r}))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return out / result.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_wheels_and_sdists_carry_the_files_and_an_install_finds_them_by_short_name(tmp_path):
    checkout = _copy_checkout(tmp_path / "checkout")
    sdist = _build("sdist", checkout, tmp_path / "dist")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    inside = unpacked / "advpt" / "ds_configs" / "shipped"
    assert not inside.is_symlink() and len(list(inside.glob("*/*.json"))) == len(FILES)
    for source in (checkout, unpacked):  # pip builds a wheel from either
        wheel = _build("wheel", source, tmp_path / f"wheel-{source.name}")
        with zipfile.ZipFile(wheel) as archive:
            for file in FILES:
                name = f"advpt/ds_configs/shipped/{file.parent.name}/{file.name}"
                assert archive.read(name) == file.read_bytes(), name
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    code = (
        "import advpt.ds_configs as d; print(d.__file__); "
        "print(*(d.resolve(n.split('/')[1], n.split('/')[0], False) for n in d.specs()))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    module, found = result.stdout.splitlines()
    assert module.startswith(str(target))
    paths = [Path(p) for p in found.split()]
    assert [p.read_bytes() for p in paths] == [
        (TOP_LEVEL / p.parent.name / p.name).read_bytes() for p in paths
    ]
    assert len(paths) == len(FILES)
