"""Every setting of a run: documented dataclasses, filled from a run file and command-line flags.

- ``section``: a documented, type-checked group of settings (``Section``); knows no flags;
- ``cli``: one flag per setting, ``--help`` from the docstrings, JSON/YAML run files (``parse``);
- ``pretrain``: pre-training's settings (``TrainConfig`` and its sections);
- ``finetune``: fine-tuning's (``FinetuneConfig``);
- ``evaluation``: the downstream suite's (``EvaluateConfig``) and ``advpt prepare-suite``'s;
- ``commands``: the smaller commands' (``ScoreConfig``, ``EmbedConfig``, ...);
- ``duration``: ``--max_time`` values (``90m``, Slurm's ``D-HH:MM:SS``) in seconds.

``section``, ``cli`` and ``duration`` sit at the base of the house, and ``evaluation`` and
``commands`` with them, free of torch so that their commands' ``--help`` is quick. ``pretrain``
and ``finetune`` import their choices (presets, backends, tasks) from the code that implements
them, so they stand above ``data``, ``masking`` and ``models`` and below ``training``; only the
entry points read ``cli``.
"""
