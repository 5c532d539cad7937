"""Every setting of a run: documented dataclasses, filled from a run file and command-line flags.

- ``section``: a documented, type-checked group of settings (``Section``); knows no flags;
- ``cli``: one flag per setting, ``--help`` from the docstrings, JSON/YAML run files (``parse``);
- ``pretrain``: pre-training's settings (``TrainConfig`` and its sections);
- ``finetune``: fine-tuning's (``FinetuneConfig``);
- ``duration``: ``--max_time`` values (``90m``, Slurm's ``D-HH:MM:SS``) in seconds.

``section``, ``cli`` and ``duration`` sit at the base of the house. ``pretrain`` and ``finetune``
import their choices (presets, backends, tasks) from the code that implements them, so they stand
above ``data``, ``masking`` and ``models`` and below ``training``; only the entry points read
``cli``.
"""
