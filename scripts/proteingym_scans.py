"""A folder in ProteinGym's layout made from the suite's four scans, where ProteinGym itself is
not at hand (this machine cannot download it; the tests and docs/evaluate.md use it):

    python scripts/proteingym_scans.py DIR [--limit N]
    python -m advpt.evaluate MODEL --proteingym DIR --out evaluation/gym

Writes ``DIR/DMS_substitutions.csv`` and one assay file per scan of
:mod:`advpt.downstream.dms` (MAVE-NN's files, read where ``pip install --no-deps mavenn==1.1.4``
puts them): ``mutant``, ``mutated_sequence``, ``DMS_score`` (the scan's fitness, higher fitter)
and ``DMS_score_bin``, 1 where ``DMS_score`` is above the scan's median (ProteinGym's "median"
binarisation method; the cutoff is in the reference file). The ids follow ProteinGym's
``<UniProt entry name>_<author>_<year>`` with ``_mavenn`` added: these are MAVE-NN's versions of
the scans (wild types cut to the mutated region, stops dropped), not ProteinGym's files, and
their numbers are not ProteinGym's. ``--limit N`` keeps a seeded sample of N variants per scan.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from advpt.command import DEBUG_HELP, command
from advpt.config.cli import positive
from advpt.data.sampling import sample_at_most
from advpt.downstream.dms import SCANS, apply, read_scan
from advpt.errors import WRITE_ERRORS, cannot_write

# scan -> (DMS_id, UniProt_ID, coarse_selection_type as ProteinGym has it for these proteins)
ASSAYS = {
    "gb1_binding": ("SPG1_STRSG_Olson_2014_mavenn", "SPG1_STRSG", "Binding"),
    "gb1_stability": ("SPG1_STRSG_Nisthal_2019_mavenn", "SPG1_STRSG", "Stability"),
    "abeta42_nucleation": ("A4_HUMAN_Seuma_2021_mavenn", "A4_HUMAN", "Stability"),
    "tdp43_toxicity": ("TADBP_HUMAN_Bolognesi_2019_mavenn", "TADBP_HUMAN", "OrganismalFitness"),
}
REFERENCE = (
    "DMS_id", "DMS_filename", "UniProt_ID", "target_seq", "seq_len", "DMS_total_number_mutants",
    "DMS_binarization_cutoff", "DMS_binarization_method", "coarse_selection_type",
)  # fmt: skip


def write_csv(path: Path, header: tuple[str, ...] | list[str], rows) -> None:
    try:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)
    except WRITE_ERRORS as err:
        raise cannot_write(err, path) from err


def write_folder(folder: Path, limit: int | None = None, seed: int = 0) -> list[dict[str, str]]:
    """The four assay files and the reference file in ``folder``; the reference rows."""
    folder.mkdir(parents=True, exist_ok=True)
    reference = []
    for name in SCANS:
        scan = read_scan(name)
        rows = sample_at_most(len(scan.variants), limit or 0, seed)
        fitness = scan.fitness[rows]
        cutoff = float(np.median(fitness))
        dms_id, uniprot, kind = ASSAYS[name]
        write_csv(
            folder / f"{dms_id}.csv",
            ("mutant", "mutated_sequence", "DMS_score", "DMS_score_bin"),
            (
                (
                    ":".join(f"{m.wild_type}{m.position}{m.mutant}" for m in scan.variants[i]),
                    apply(scan.wild_type, scan.variants[i]),
                    repr(float(y)),
                    int(y > cutoff),
                )
                for i, y in zip(rows.tolist(), fitness, strict=True)
            ),
        )
        values = (dms_id, f"{dms_id}.csv", uniprot, scan.wild_type, len(scan.wild_type),
                  len(rows), repr(cutoff), "median", kind)  # fmt: skip
        reference.append(dict(zip(REFERENCE, map(str, values), strict=True)))
    write_csv(folder / "DMS_substitutions.csv", REFERENCE, (r.values() for r in reference))
    return reference


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="where to write the reference file and the assay files")
    parser.add_argument("--limit", type=positive, help="a seeded sample of this many per scan")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    for row in write_folder(Path(args.folder), args.limit):
        print(f"{row['DMS_filename']}: {int(row['DMS_total_number_mutants']):,} variants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
