"""``python -m advpt.environment [--json FILE] [--commit REV] [--device DEVICE]``: the device and
the software this machine's runs use, on one line (:func:`advpt.environment.describe`), and with
``--json`` written to FILE: what to paste into a bug report, and what ``scripts/gpu_check.sh``
stores beside its figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from advpt.command import DEBUG_HELP, command
from advpt.environment import describe, environment, pick_device
from advpt.errors import ConfigError, OutputError
from advpt.outputs import write_atomically


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m advpt.environment", description=__doc__)
    parser.add_argument("--json", type=Path, help="also write the report to this file, as JSON")
    parser.add_argument("--commit", help="advpt's commit, where the checkout has no .git")
    parser.add_argument(
        "--device", help="the device to report, e.g. cpu for a run on the CPU of a GPU machine "
        "(default: the current GPU, if one is visible)",
    )  # fmt: skip
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    if args.json is not None and args.json.is_dir():
        raise ConfigError(f"--json {args.json} is a folder; name the file to write")
    device = None if args.device is None else pick_device(args.device)
    info = environment(device, args.commit)
    print(describe(info))
    if args.json is not None:
        try:
            write_atomically(args.json, json.dumps(info, indent=2) + "\n")
        except OSError as err:  # named by the file asked for, not the staging file beside it
            raise OutputError(f"cannot write {args.json}: {err.strerror or err}") from err
    return 0


if __name__ == "__main__":
    sys.exit(main())
