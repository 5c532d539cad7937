"""Every setting of a run: documented dataclasses, filled from a run file and command-line flags.

- ``section``: a documented, type-checked group of settings (``Section``); knows no flags;
- ``cli``: one flag per setting, ``--help`` from the docstrings, JSON/YAML run files (``parse``);
- ``pretrain``: pre-training's settings (``TrainConfig`` and its sections);
- ``finetune``: fine-tuning's (``FinetuneConfig``);
- ``duration``: ``--max_time`` values (``90m``, Slurm's ``D-HH:MM:SS``) in seconds.

Training reads ``pretrain`` and ``finetune``; only the entry points read ``cli``.
"""
