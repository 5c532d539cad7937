"""The reader of ProMod3's structure database (``advpt.downstream.structure_db``) on the file that
Debian's promod3-data installs, whole, cut short and with a letter corrupted."""

import mmap
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from advpt.downstream import structure_db
from advpt.downstream.structure_db import DSSP_STATES, STRUCTURE_DB, Chain, read_structure_db
from advpt.errors import DataError

needs_db = pytest.mark.skipif(
    not STRUCTURE_DB.exists(), reason="promod3-data is not installed (apt-get install promod3-data)"
)

STANDARD_AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"


@pytest.fixture(scope="module")
def chains() -> list[Chain]:
    return read_structure_db()


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[Path]:
    """A copy of the installed file, to cut or corrupt; deleted after the test (520 MB)."""
    path = Path(shutil.copyfile(STRUCTURE_DB, tmp_path / "structure_db.dat"))
    yield path
    path.unlink()


def position(text: str) -> int:
    """Where ``text`` first occurs in the installed file."""
    with (
        open(STRUCTURE_DB, "rb") as file,
        mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        found = m.find(text.encode())
    assert found >= 0
    return found


def patch(path: Path, at: int, letter: str) -> None:
    """Overwrites the byte at ``at`` of ``path`` with ``letter``."""
    with open(path, "r+b") as file:
        file.seek(at)
        file.write(letter.encode())


@needs_db
def test_reads_every_chain(chains: list[Chain]) -> None:
    # promod3-data 3.2.1: 21,119 chains of 4,561,225 residues
    assert len(chains) == 21_119
    assert sum(len(chain.sequence) for chain in chains) == 4_561_225
    assert len({chain.name for chain in chains}) == len(chains)
    assert all(len(chain.sequence) == len(chain.dssp) > 0 for chain in chains)
    assert set("".join(chain.sequence for chain in chains)) == set(STANDARD_AMINO_ACIDS)
    assert set("".join(chain.dssp for chain in chains)) == set(DSSP_STATES)


@needs_db
def test_first_and_last_chain(chains: list[Chain]) -> None:
    # 12AS: E. coli asparagine synthetase A (UniProt P00963) from residue 4, a helix at its start
    first = chains[0]
    assert (first.name, len(first.sequence)) == ("12ASA", 327)
    assert first.sequence.startswith("AYIAKQRQISFVKSHFSRQLEERLGLIEV")
    assert first.dssp.startswith("CHHHHHHHHHHHHHHHHHHHHHHHCEEE")
    assert chains[-1].name == "8PCHA"


@needs_db
def test_limit(chains: list[Chain]) -> None:
    assert read_structure_db(limit=3) == chains[:3]
    assert read_structure_db(limit=0) == []


@needs_db
@pytest.mark.parametrize(
    "size",
    [0, 40, 100_000, 1_000_000, -1],
    ids=["empty", "in-header", "in-chains", "in-sequences", "last-byte"],
)
def test_cut_file(copy: Path, size: int) -> None:
    os.truncate(copy, size % copy.stat().st_size)
    with pytest.raises(DataError, match="truncated") as caught:
        read_structure_db(copy)
    assert str(copy) in str(caught.value)


@needs_db
def test_corrupted_residue(copy: Path, chains: list[Chain]) -> None:
    patch(copy, position(chains[1].sequence) + 5, "J")
    with pytest.raises(DataError, match="chain 16PKA has 'J' at position 6") as caught:
        read_structure_db(copy)
    assert str(copy) in str(caught.value)


@needs_db
def test_corrupted_dssp_state(copy: Path, chains: list[Chain]) -> None:
    patch(copy, position(chains[1].dssp), " ")
    with pytest.raises(DataError, match="chain 16PKA has ' ' at position 1") as caught:
        read_structure_db(copy)
    assert str(copy) in str(caught.value)


@needs_db
@pytest.mark.parametrize(
    ("at", "letter", "message"),
    [(0, "X", "not a ProMod3 structure database"), (4, "\x03", "version 3")],
)
def test_wrong_header(tmp_path: Path, at: int, letter: str, message: str) -> None:
    path = tmp_path / "structure_db.dat"
    with open(STRUCTURE_DB, "rb") as file:
        path.write_bytes(file.read(1000))
    patch(path, at, letter)
    with pytest.raises(DataError, match=message) as caught:
        read_structure_db(path)
    assert str(path) in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist") as caught:
        read_structure_db(tmp_path / "none.dat")
    assert str(tmp_path / "none.dat") in str(caught.value)


def test_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(structure_db, "STRUCTURE_DB", tmp_path / "structure_db.dat")
    with pytest.raises(DataError, match="apt-get install promod3-data"):
        read_structure_db(tmp_path / "structure_db.dat")
