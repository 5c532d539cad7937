"""The data pipeline at scale: prepare throughput, open time, command to first step, rank memory.

    python scripts/bench_data.py                                   # 1 GB of FASTA
    python scripts/bench_data.py --size_gb 2 --json runs/bench_data.json

Writes a synthetic UniProt-like FASTA of ``--size_gb`` (realistic TrEMBL headers, 60-letter
lines, log-normal lengths with median 300, amino acids at their UniProt background frequencies)
into ``--workdir``, then measures, on this machine:

* ``prepare``: ``python -m advpt.prepare``'s throughput in MB of FASTA per second, on one
  worker process (per core) and on one per core;
* ``open``: opening the prepared dataset, and that plus building a rank's stream (held-out split,
  bucketed batches) up to its first micro-batch;
* ``first step``: wall time from starting ``python -m advpt.train --data FASTA`` (tiny models,
  random MLM) to its first logged optimizer step, at the first start (which prepares the cache)
  and the second (which reuses it);
* ``runs``: under the deepspeed launcher with 1 and 2 ranks (``--ranks``), on this dataset
  (prepared already) and on the bundled proteome (2,100 records): the time from the command to
  the first logged step, and ``--steps`` steps in, the proportional set size (PSS: shared pages
  divided among the processes that map them) of each rank, DataLoader worker included. The
  difference between the two datasets is what the dataset's size adds to a rank.

Needs psutil (in advpt's [dev] extra). CPU only (``DS_ACCELERATOR=cpu`` is set for the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.data.cache import locate
from advpt.data.ingest import prepare
from advpt.data.residue_store import ProteinDataset
from advpt.training.engines.engine import simple_ds_config
from advpt.training.reporting.run_metrics import read_rows

REPO = Path(__file__).resolve().parent.parent

# UniProtKB/Swiss-Prot amino-acid composition (release 2024_01), percent.
COMPOSITION = {
    "A": 8.25, "R": 5.53, "N": 4.06, "D": 5.45, "C": 1.37, "Q": 3.93, "E": 6.75, "G": 7.07,
    "H": 2.27, "I": 5.96, "L": 9.66, "K": 5.84, "M": 2.42, "F": 3.86, "P": 4.70, "S": 6.56,
    "T": 5.34, "W": 1.08, "Y": 2.92, "V": 6.87,
}  # fmt: skip
SPECIES = [
    ("HUMAN", "Homo sapiens", 9606), ("MOUSE", "Mus musculus", 10090),
    ("ECOLI", "Escherichia coli (strain K12)", 83333), ("YEAST", "Saccharomyces cerevisiae", 4932),
    ("9BACT", "uncultured bacterium", 77133), ("ARATH", "Arabidopsis thaliana", 3702),
]  # fmt: skip
RECORDS_PER_CHUNK = 20_000


def write_fasta(path: Path, size: int, seed: int = 0) -> int:
    """Write about ``size`` bytes of UniProt-like FASTA to ``path``; returns the record count.

    Vectorised: residues are drawn per chunk and laid out with their newlines by index
    arithmetic, so a gigabyte takes well under a minute.
    """
    rng = np.random.default_rng(seed)
    letters = np.frombuffer("".join(COMPOSITION).encode(), np.uint8)
    weights = np.array(list(COMPOSITION.values()))
    weights /= weights.sum()
    written = records = 0
    with path.open("wb") as out:
        while written < size:
            lengths = np.clip(rng.lognormal(np.log(300), 0.6, RECORDS_PER_CHUNK), 30, 35_000)
            lengths = lengths.astype(np.int64)
            residues = letters[rng.choice(len(letters), int(lengths.sum()), p=weights)]
            headers = []
            for i in range(RECORDS_PER_CHUNK):
                code, name, taxon = SPECIES[(records + i) % len(SPECIES)]
                accession = f"A0A{rng.integers(0, 36**7):07X}"[:10]
                headers.append(
                    f">tr|{accession}|{accession}_{code} Uncharacterized protein "
                    f"OS={name} OX={taxon} GN=ORF{records + i} PE=4 SV=1\n".encode()
                )
            header_lengths = np.array([len(h) for h in headers])
            line_breaks = -(-lengths // 60)
            sizes = header_lengths + lengths + line_breaks
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            buf = np.full(int(sizes.sum()), ord("\n"), np.uint8)
            header_at = np.repeat(starts, header_lengths) + _within(header_lengths)
            buf[header_at] = np.frombuffer(b"".join(headers), np.uint8)
            within = _within(lengths)
            buf[np.repeat(starts + header_lengths, lengths) + within + within // 60] = residues
            out.write(buf.tobytes())
            written += len(buf)
            records += RECORDS_PER_CHUNK
    return records


def _within(lengths: np.ndarray) -> np.ndarray:
    """0, 1, ..., n_i - 1 for each of ``lengths``, concatenated."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.arange(int(lengths.sum())) - np.repeat(starts, lengths)


def ds_config(path: Path, world: int) -> str:
    """Micro-batches of 8 on each of ``world`` ranks, written to ``path``."""
    path.write_text(json.dumps(simple_ds_config(8, 8 * world)))
    return str(path)


def train_args(workdir: Path, data: str, run_dir: Path, world: int) -> list[str]:
    return [
        "--deepspeed_config", ds_config(workdir / f"ds{world}.json", world), "--mode", "random",
        "--encoder", "tiny", "--max_length", "128", "--data", data, "--data_cache",
        str(workdir / "cache"), "--run_dir", str(run_dir), "--max_steps", "100000",
        "--log_every", "1", "--eval_every", "1000000", "--checkpoint_every", "1000000",
        "--warmup_steps", "10",
    ]  # fmt: skip


def child_env() -> dict[str, str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(key, None)
    return env


def run_until_step(command: list[str], run_dir: Path, step: int, timeout: float = 900):
    """Start ``command``; return (seconds to the first logged step, process) once ``step`` is
    logged. The caller stops the process (its own session) with :func:`stop`."""
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=REPO, env=child_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = None
    while time.perf_counter() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:3]} exited: {process.stderr.read()[-3000:]}")
        steps = [row["step"] for row in read_rows(run_dir, missing_ok=True)]
        if steps and first is None:
            first = time.perf_counter() - start
        if steps and steps[-1] >= step:
            return first, process
        time.sleep(0.05)
    stop(process)
    raise RuntimeError(f"no step {step} within {timeout} s")


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def rank_memory(process: subprocess.Popen, cache: Path) -> list[dict[str, float]]:
    """Memory (MB) of every rank below ``process``, each with its DataLoader workers: PSS, USS,
    and the PSS of its maps of the prepared dataset (pages of the shared page cache)."""
    ranks = []
    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            if not _is_rank(child) or _is_rank(child.parent()):
                continue  # not a rank, or a rank's DataLoader worker (counted with its rank)
            group = [child, *child.children(recursive=True)]
            info = [p.memory_full_info() for p in group]
            maps = [m for p in group for m in p.memory_maps() if m.path.startswith(str(cache))]
            ranks.append({
                "pss_mb": sum(i.pss for i in info) / 1e6,
                "uss_mb": sum(i.uss for i in info) / 1e6,
                "dataset_maps_pss_mb": sum(m.pss for m in maps) / 1e6,
            })  # fmt: skip
        except psutil.NoSuchProcess:
            continue
    return ranks


def _is_rank(process: psutil.Process) -> bool:
    return any(arg.startswith("--local_rank=") for arg in process.cmdline())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_run(workdir: Path, data: str, world: int, steps: int) -> dict:
    """A run under the deepspeed launcher with ``world`` ranks: seconds from the command to its
    first logged step, and every rank's memory ``steps`` steps in."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    run_dir = workdir / f"mem{world}"
    command = [
        launcher, "--num_gpus", str(world), "--master_port", str(free_port()), "advpt/train.py",
        *train_args(workdir, data, run_dir, world), "--num_workers", "1",
    ]  # fmt: skip
    first_step, process = run_until_step(command, run_dir, steps)
    try:
        return {"first_step_s": first_step, "ranks": rank_memory(process, workdir / "cache")}
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size_gb", type=float, default=1.0, help="size of the synthetic FASTA")
    parser.add_argument(
        "--workdir", help="where the FASTA, cache and runs go (default: a temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep --workdir afterwards")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="memory: rank counts")
    parser.add_argument("--steps", type=int, default=20, help="memory: steps before measuring")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="advpt-bench-data-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"size_gb": args.size_gb, "cores": len(os.sched_getaffinity(0))}
    try:
        fasta = workdir / "uniprot_like.fasta"
        start = time.perf_counter()
        results["records"] = write_fasta(fasta, int(args.size_gb * 1e9))
        mb = fasta.stat().st_size / 1e6
        print(f"wrote {fasta} ({mb:.0f} MB, {results['records']:,} records) in "
              f"{time.perf_counter() - start:.0f} s")  # fmt: skip

        for label, workers in (("prepare_1_worker", 1), ("prepare_all_cores", 0)):
            out = workdir / f"prepared_{workers}"
            wall, cpu = time.perf_counter(), time.process_time()
            prepare([str(fasta)], out, workers=workers, progress=False)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results[label] = {"seconds": wall, "mb_per_s": mb / wall}
            results["prepared_mb"] = sum(f.stat().st_size for f in out.iterdir()) / 1e6
            print(f"{label}: {wall:.1f} s, {mb / wall:.0f} MB/s (this process's CPU: {cpu:.1f} s); "
                  f"{results['prepared_mb']:.0f} MB prepared")  # fmt: skip

        from advpt.config.cli import parse
        from advpt.config.pretrain import TrainConfig
        from advpt.training.assembly import build_data

        prepared = workdir / "prepared_1"
        opens = []
        for _ in range(5):
            start = time.perf_counter()
            ProteinDataset(prepared)
            opens.append(time.perf_counter() - start)
        config = parse(TrainConfig, ["--data", str(prepared), "--max_length", "512"])
        start = time.perf_counter()
        stream, _ = build_data(config, micro_batch=32, rank=0, world=1)
        stream[0]
        results["open_s"] = min(opens)
        results["open_to_first_batch_s"] = time.perf_counter() - start
        print(f"open: {min(opens) * 1e3:.1f} ms; open + split + first batch of 32: "
              f"{results['open_to_first_batch_s'] * 1e3:.0f} ms")  # fmt: skip

        for label in ("first_start_s", "second_start_s"):
            command = [sys.executable, "-m", "advpt.train", "--num_workers", "1"]
            command += train_args(workdir, str(fasta), workdir / "run", 1)
            seconds, process = run_until_step(command, workdir / "run", 1)
            stop(process)
            results[label] = seconds
            print(f"command to first step, {label.split('_')[0]} start: {seconds:.1f} s")

        locate(BUNDLED_PROTEOME, str(workdir / "cache")).ensure(progress=False)  # prepared ahead
        for world in args.ranks:
            for name, data in (("bundled", BUNDLED_PROTEOME), ("synthetic", str(fasta))):
                run = measure_run(workdir, data, world, args.steps)
                results[f"run_{world}_ranks_{name}"] = run
                shown = ", ".join(
                    f"PSS {r['pss_mb']:.0f} MB (USS {r['uss_mb']:.0f}, dataset maps "
                    f"{r['dataset_maps_pss_mb']:.1f})"
                    for r in run["ranks"]
                )
                print(f"{world} rank(s), {name}: first step after {run['first_step_s']:.1f} s; "
                      f"{shown}")  # fmt: skip
            big = results[f"run_{world}_ranks_synthetic"]["ranks"]
            small = results[f"run_{world}_ranks_bundled"]["ranks"]
            growth = max(b["pss_mb"] - s["pss_mb"] for b, s in zip(big, small, strict=True))
            results[f"memory_growth_{world}_ranks_mb"] = growth
            print(f"{world} rank(s): the {mb:.0f} MB dataset adds at most {growth:.0f} MB per rank")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
