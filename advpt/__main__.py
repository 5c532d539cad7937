"""``advpt COMMAND [flags]``: every command of advpt, as one program (the console script
``advpt``, or ``python -m advpt``).

Each command runs the same ``main(argv)`` as ``python -m advpt.<module>`` (:data:`COMMANDS`), and
its flags are the fields of a settings root (``advpt.config.cli``). ``advpt COMMAND --help`` is
printed from that root alone, so that it imports neither torch nor DeepSpeed where the root
does not (pre-training's and fine-tuning's import the model presets, and so torch); the
command's module, which does, is imported only to run it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from advpt.command import command
from advpt.config.cli import parse


@dataclass(frozen=True)
class Command:
    """One command: the module whose ``main(argv)`` runs it, its settings root (``module:Class``)
    and its line in ``advpt --help``."""

    module: str
    settings: str
    summary: str

    def settings_root(self) -> type:
        """The settings root, imported without the command's module."""
        module, _, name = self.settings.partition(":")
        return getattr(importlib.import_module(module), name)


COMMANDS = {
    "train": Command(
        "advpt.train",
        "advpt.config.pretrain:TrainConfig",
        "pre-train an encoder, adversarial or random masking (deepspeed advpt/train.py for GPUs)",
    ),
    "finetune": Command(
        "advpt.finetune",
        "advpt.config.finetuning:FinetuneConfig",
        "fine-tune a pre-trained encoder on a TAPE task and score it",
    ),
    "evaluate": Command(
        "advpt.evaluate",
        "advpt.config.evaluation:EvaluateConfig",
        "score frozen encoders on the downstream suite, or on ProteinGym",
    ),
    "score": Command(
        "advpt.score",
        "advpt.config.tools:ScoreConfig",
        "zero-shot variant-effect scores of a protein's mutations, from a CSV",
    ),
    "embed": Command(
        "advpt.embed",
        "advpt.config.tools:EmbedConfig",
        "sequence embeddings of FASTA or other data, as an .npz",
    ),
    "export": Command(
        "advpt.export",
        "advpt.config.tools:ExportConfig",
        "export a pre-trained model: advpt, TAPE or Hugging Face files",
    ),
    "report": Command(
        "advpt.report",
        "advpt.config.tools:ReportConfig",
        "summarise a pre-training run, or compare several, with plots",
    ),
    "study": Command(
        "advpt.study.__main__",
        "advpt.study.options:StudyConfig",
        "the masking study: every recipe over seeds, written up as study.md",
    ),
    "prepare": Command(
        "advpt.prepare",
        "advpt.config.tools:PrepareConfig",
        "prepare FASTA, TAPE LMDB/JSON or Parquet inputs into a dataset for --data",
    ),
    "swissprot": Command(
        "advpt.swissprot",
        "advpt.config.tools:SwissprotConfig",
        "prepare Swiss-Prot (metastudent-data) as a corpus, with its clusters",
    ),
    "prepare-suite": Command(
        "advpt.downstream.prepare_suite",
        "advpt.config.evaluation:PrepareSuiteConfig",
        "prepare the downstream suite's data from installed packages",
    ),
    "build-extensions": Command(
        "advpt.build_extensions",
        "advpt.config.tools:BuildExtensionsConfig",
        "build the C++ ops this machine's runs use, once",
    ),
    "env": Command(
        "advpt.environment.__main__",
        "advpt.config.tools:EnvironmentConfig",
        "the device and software this machine's runs use, for a bug report",
    ),
}
"""Command name -> what runs it, in the order ``advpt --help`` lists them."""

HELP_FLAGS = ("-h", "--help")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the command's name alone; its flags are the command's own."""
    parser = argparse.ArgumentParser(
        prog="advpt",
        description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="advpt COMMAND --help lists the command's flags; python -m advpt.<module> runs "
        "the same command (advpt.train, advpt.score, ...).",
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, title="commands"
    )
    for name, entry in COMMANDS.items():
        commands.add_parser(name, help=entry.summary, add_help=False)
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    """The command's own exit code; 2 with argparse's sentence for no or an unknown command."""
    argv = sys.argv[1:] if argv is None else argv
    name = build_parser().parse_args(argv[:1]).command
    entry, flags = COMMANDS[name], argv[1:]
    if any(flag in flags for flag in HELP_FLAGS):  # argparse prints the help and exits
        parse(entry.settings_root(), flags, f"advpt {name}")
    return importlib.import_module(entry.module).main(flags)


if __name__ == "__main__":
    sys.exit(main())
