"""The deep mutational scans (``advpt.downstream.dms``) read from MAVE-NN's installed files,
checked against the files read independently here, and damaged copies of them."""

from __future__ import annotations

import collections
import csv
import gzip
import io
import sys

import numpy as np
import pytest

from advpt.downstream.dms import SCANS, SOURCES, datasets_dir, read_scan
from advpt.errors import DataError

# name: (variants, {sites: variants}, [train, valid, test], rows dropped for a stop)
EXPECTED = {
    "gb1_binding": (530_737, {2: 530_737}, [477_854, 26_519, 26_364], 0),
    "gb1_stability": (813, {1: 813}, [673, 76, 64], 0),
    "abeta42_nucleation": (14_483, {1: 468, 2: 14_015}, [13_077, 731, 675], 1_583),
    "tdp43_toxicity": (53_468, {1: 1_196, 2: 52_272}, [48_159, 2_702, 2_607], 4_528),
}


@pytest.fixture(scope="module")
def scans():
    if not datasets_dir().is_dir():
        pytest.skip("mavenn's data sets are not installed: pip install --no-deps mavenn==1.1.4")
    return {name: read_scan(name) for name in SCANS}


def file_columns(name: str) -> dict[str, list[str]]:
    """The columns of the scan's installed file by header name, read here with the csv module."""
    with gzip.open(datasets_dir() / SOURCES[name].file, "rt", newline="") as handle:
        header, *rows = csv.reader(handle)
    return dict(zip(header, map(list, zip(*rows, strict=True)), strict=True))


def letters(sequences: list[str]) -> np.ndarray:
    """The equally long ``sequences`` as letter bytes ``[n, L]``."""
    return np.frombuffer("".join(sequences).encode(), np.uint8).reshape(len(sequences), -1)


def as_bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8)


def test_mavenn_is_found_without_importing_it(scans):
    assert (datasets_dir() / "gb1_data.csv.gz").is_file()
    assert "mavenn" not in sys.modules


# GB1 binding's 530,737 rows, checked one by one, take seconds: the slow tier's
BY_SIZE = [pytest.param(name, marks=pytest.mark.slow) if name == "gb1_binding" else name
           for name in SCANS]  # fmt: skip


@pytest.mark.parametrize("name", BY_SIZE)
def test_scan_matches_its_file(scans, name):
    scan, source = scans[name], SOURCES[name]
    variants, sizes, split_sizes, stops = EXPECTED[name]
    assert len(scan.variants) == len(scan.fitness) == len(scan.split) == variants
    assert dict(collections.Counter(map(len, scan.variants))) == sizes
    assert np.bincount(scan.split, minlength=3).tolist() == split_sizes
    assert scan.fitness.dtype == np.float64 and scan.split.dtype == np.int8
    columns = file_columns(name)
    found = letters(columns["x"])  # [rows, L]
    # the wild type is the per-position consensus, and differs from each row at its ``dist``
    counts = np.stack([np.bincount(column, minlength=256) for column in found.T])  # [L, 256]
    assert bytes(counts.argmax(axis=1).astype(np.uint8)).decode() == scan.wild_type
    assert scan.wild_type == source.wild_type
    if "dist" in columns:
        differ = (found != as_bytes(scan.wild_type)).sum(axis=1)
        assert (differ == np.array(columns["dist"], dtype=np.int64)).all()
    stopped = (found == ord("*")).any(axis=1)
    assert stopped.sum() == stops == len(found) - variants
    # the variants are the file's rows without a stop, in order, with their y and side
    assert scan.sequences() == [x for x, cut in zip(columns["x"], stopped, strict=True) if not cut]
    y = np.array(columns["y"], dtype=np.float64)[~stopped]
    assert (scan.fitness == source.sign * y).all()
    if "set" in columns:
        sides = {"training": 0, "validation": 1, "test": 2}
        side = np.array([sides[text] for text in columns["set"]], dtype=np.int8)[~stopped]
        assert (scan.split == side).all()


@pytest.mark.parametrize("name", BY_SIZE)
def test_sites_agree_with_sequences(scans, name):
    scan = scans[name]
    wild_type = as_bytes(scan.wild_type)
    sequences = scan.sequences()
    found = letters(sequences)  # [n, L]
    variants, positions = np.nonzero(found != wild_type)  # [S] each, by variant then position
    sites = [(i, site) for i, sites in enumerate(scan.variants) for site in sites]  # [S]
    assert [i for i, _ in sites] == variants.tolist()
    assert [site.position - 1 for _, site in sites] == positions.tolist()
    assert (as_bytes("".join(site.wild_type for _, site in sites)) == wild_type[positions]).all()
    assert (as_bytes("".join(site.mutant for _, site in sites)) == found[variants, positions]).all()
    assert scan.sequences(np.array([5, 0, 3])) == [sequences[5], sequences[0], sequences[3]]


def test_signs_follow_the_papers(scans):
    """Higher fitness is tighter binding, more stability, faster nucleation, less toxicity."""

    def fitness(name: str, mutations: str) -> float:
        scan = scans[name]
        found = [
            scan.fitness[i]
            for i, sites in enumerate(scan.variants)
            if ":".join(f"{s.wild_type}{s.position}{s.mutant}" for s in sites) == mutations
        ]
        assert len(found) == 1, mutations
        return found[0]

    # Nisthal: F30A and Y3I (positions 29 and 2 here) destabilise, Y3F and L7I stabilise
    assert fitness("gb1_stability", "F29A") < -2 and fitness("gb1_stability", "Y2I") < -2
    assert fitness("gb1_stability", "Y2F") > 0 and fitness("gb1_stability", "L6I") > 0
    # Seuma: the familial Arctic (E22G) and Dutch (E22Q) mutations nucleate faster
    assert fitness("abeta42_nucleation", "E22G") > 1 and fitness("abeta42_nucleation", "E22Q") > 1
    # Bolognesi: hydrophobic substitutions lower toxicity, charged ones raise it
    scan = scans["tdp43_toxicity"]
    singles = collections.defaultdict(list)
    for sites, value in zip(scan.variants, scan.fitness, strict=True):
        if len(sites) == 1:
            singles[sites[0].mutant in "ILVFMW"].append(value)
    assert np.mean(singles[True]) > 0 > np.mean(singles[False])
    # Olson: the binding enrichment is relative to the wild type, so most doubles are below it
    assert np.median(scans["gb1_binding"].fitness) < 0


def damaged(tmp_path, name: str, edit) -> str:
    """Copy the scan's file to ``tmp_path`` with its lines changed by ``edit``; the file's
    path."""
    source = datasets_dir() / SOURCES[name].file
    with gzip.open(source, "rt", newline="") as handle:
        lines = handle.read().splitlines(keepends=True)
    target = tmp_path / source.name
    with gzip.open(target, "wt", newline="") as handle:
        handle.write("".join(edit(lines)))
    return str(target)


def replace_field(lines: list[str], line: int, column: str, value: str) -> list[str]:
    """``lines`` with the field ``column`` of 1-based ``line`` set to ``value``."""
    header = next(csv.reader([lines[0]]))
    fields = next(csv.reader([lines[line - 1]]))
    fields[header.index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(fields)
    return [*lines[: line - 1], out.getvalue(), *lines[line:]]


def test_missing_column(tmp_path):
    path = damaged(
        tmp_path, "abeta42_nucleation", lambda lines: [lines[0].replace(",y,", ",z,")] + lines[1:]
    )
    with pytest.raises(DataError, match="no column y") as err:
        read_scan("abeta42_nucleation", folder=tmp_path)
    assert path in str(err.value)


@pytest.mark.parametrize("letter", ["7", "a", "é"])
def test_letter_outside_the_alphabet(tmp_path, letter):
    def edit(lines):
        return replace_field(lines, 9, "x", letter + lines[8].split(",")[-1][1:].rstrip("\n"))

    path = damaged(tmp_path, "abeta42_nucleation", edit)
    with pytest.raises(DataError, match=f"line 9: '{letter}' is no amino-acid letter") as err:
        read_scan("abeta42_nucleation", folder=tmp_path)
    assert path in str(err.value)


def test_quoted_fields_keep_line_numbers(tmp_path):
    """Nisthal's file quotes names with commas; the line named is still the file's."""

    def edit(lines):
        return replace_field(lines, 50, "x", lines[49][:54])

    path = damaged(tmp_path, "gb1_stability", edit)
    with pytest.raises(DataError, match="line 50: the sequence has 54 letters, not the 55") as err:
        read_scan("gb1_stability", folder=tmp_path)
    assert path in str(err.value)


def test_cut_gzip(tmp_path):
    source = datasets_dir() / SOURCES["tdp43_toxicity"].file
    data = source.read_bytes()
    (tmp_path / source.name).write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cannot read") as err:
        read_scan("tdp43_toxicity", folder=tmp_path)
    assert str(tmp_path / source.name) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="cannot read .*nisthal_data.csv.gz: No such file"):
        read_scan("gb1_stability", folder=tmp_path)


@pytest.mark.parametrize("value", ["abc", "inf"])
def test_bad_y(tmp_path, value):
    path = damaged(tmp_path, "gb1_stability", lambda lines: replace_field(lines, 14, "y", value))
    with pytest.raises(DataError, match=f"line 14: y '{value}' is") as err:
        read_scan("gb1_stability", folder=tmp_path)
    assert path in str(err.value)


def test_empty_y_is_dropped(tmp_path):
    damaged(tmp_path, "gb1_stability", lambda lines: replace_field(lines, 14, "y", ""))
    scan = read_scan("gb1_stability", folder=tmp_path)
    assert len(scan.variants) == 812
    assert "QYKLILNGKTLKGETTTEAVDAATAEKVFKQYANDNGVDGEWTYDDATKTFTVTE" not in scan.sequences()


def test_dist_must_match_the_wild_type(tmp_path):
    path = damaged(
        tmp_path, "abeta42_nucleation", lambda lines: replace_field(lines, 3, "dist", "2")
    )
    with pytest.raises(
        DataError, match="line 3: dist is 2 but the sequence differs from the wild type at 1"
    ) as err:
        read_scan("abeta42_nucleation", folder=tmp_path)
    assert path in str(err.value)


def test_unknown_set_and_scan(tmp_path):
    damaged(tmp_path, "abeta42_nucleation", lambda lines: replace_field(lines, 4, "set", "dev"))
    with pytest.raises(DataError, match="line 4: set 'dev' is not training, validation or test"):
        read_scan("abeta42_nucleation", folder=tmp_path)
    with pytest.raises(DataError, match="there is no scan 'gb2'"):
        read_scan("gb2")


def test_missing_fields(tmp_path):
    damaged(tmp_path, "abeta42_nucleation", lambda lines: lines[:6] + ["training,1\n"] + lines[6:])
    with pytest.raises(DataError, match="line 7 has 2 fields, not 5"):
        read_scan("abeta42_nucleation", folder=tmp_path)


def test_wild_type_rows_and_stops_are_dropped(tmp_path):
    wild_type = SOURCES["abeta42_nucleation"].wild_type
    rows = [f"training,0,0.0,0.1,{wild_type}\n", f"test,1,-4.0,0.1,{wild_type[:-1]}-\n"]
    damaged(tmp_path, "abeta42_nucleation", lambda lines: lines[:1] + rows + lines[1:])
    scan = read_scan("abeta42_nucleation", folder=tmp_path)
    assert len(scan.variants) == EXPECTED["abeta42_nucleation"][0]
    assert all(scan.variants)
