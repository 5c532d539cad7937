"""Masking study: does adversarial masking pay? Several seeds per recipe, at equal updates and time.

    OMP_NUM_THREADS=1 advpt study            # small presets, ~30 min on a CPU
    advpt study --quick --out /tmp/study     # tiny presets, seconds (tests)
    advpt study --size gpu                   # larger runs, for a GPU

Recipes (``advpt.recipes.RECIPES``): random MLM at 15% and at 20%, the paper's setting
(alternating schedule, 10% random + 10% noiser), and changes of it: the context-only noiser,
the same after a random-only warm-up of a quarter of the updates, the simultaneous schedule,
importance-weighted masking. Every recipe trains for the same number of encoder updates with each
of ``--seeds`` seeds (seed ``s`` fixes the initial weights, the data order and the train/held-out
split, so recipes are paired within a seed). On the CPU two runs go at a time, each a process of
one thread (``--jobs``).

First one more run of the paper's setting, with its own seed, trains the *judge*: its noiser is
frozen, and its draws with fixed seeds pick the "hard positions" of the held-out sequences.
Every final encoder is then scored on two held-out tasks over several draws (crop window and
masks):

* random masking: 20% of the residues at random (80/10/10), scored at all of them;
* hard positions: the judge's masking (10% random + 10% chosen and corrupted by its noiser),
  scored at the judge's positions;

next to the unigram baseline (``advpt.data.unigram``: predict the training split's residue
frequencies) on the same positions. Equal wall time: each recipe's held-out loss at the training
wall time the random 20% run of its seed took, interpolated on its validation curve (the
trainer's validation pass, recorded with cumulative training wall time). Writes to ``--out``
``study.md`` and the plots ``study_scores.png``, ``study_curves.png``, ``study_residues.png``.
Runs go under ``--runs``, each rewritten unless ``--reuse`` keeps those a stopped study finished
(each records its settings in ``settings.json``; one trained with other settings is refused, naming
them); a file there that no study wrote is refused, never replaced. Needs matplotlib.

A command package: library code never imports it. Its modules, from the ground up:
``lineup`` and ``sizes`` (what is compared, at what size), ``results`` (what a study keeps and
reads back), ``runs`` (training a recipe), ``scoring`` (the held-out tasks), ``jobs`` (the work,
``--jobs`` processes at a time), ``summary`` (mean ± std over seeds, the differences to the best
heuristic), ``plots`` and ``report`` (``study.md``), ``options`` (the command's settings) and
``__main__`` (the command).
"""
