"""``advpt env [--json FILE] [--commit REV] [--device DEVICE]`` (or ``python -m
advpt.environment ...``; its settings: ``EnvironmentConfig``): the device and the software this
machine's runs use, on one line (:func:`advpt.environment.describe`), and with ``--json``
written to FILE: what to paste into a bug report, and what ``scripts/gpu_check.sh`` stores
beside its figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from advpt.command import command
from advpt.config.cli import parse
from advpt.config.tools import EnvironmentConfig
from advpt.environment import describe, environment, pick_device
from advpt.errors import ConfigError, OutputError
from advpt.outputs import write_atomically


@command
def main(argv: list[str] | None = None) -> int:
    config = parse(EnvironmentConfig, argv, "advpt env")
    report = Path(config.json) if config.json else None
    if report is not None and report.is_dir():
        raise ConfigError(f"--json {report} is a folder; name the file to write")
    device = pick_device(config.device) if config.device else None
    info = environment(device, config.commit or None)
    print(describe(info))
    if report is not None:
        try:
            write_atomically(report, json.dumps(info, indent=2) + "\n")
        except OSError as err:  # named by the file asked for, not the staging file beside it
            raise OutputError(f"cannot write {report}: {err.strerror or err}") from err
    return 0


if __name__ == "__main__":
    sys.exit(main())
