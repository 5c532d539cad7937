"""``advpt build-extensions`` (or ``python -m advpt.build_extensions``): build the C++ ops this
machine's runs use, once, into this environment's own extensions folder
(``advpt.native_builds``).

On a machine without a GPU that is DeepSpeed's shared-memory collectives op, which every run
needs to join its process group (about a minute on 2 cores); on a CUDA machine, advpt's fused
subset sampler. ``scripts/setup_env.sh`` runs it, so that no training run, test or benchmark
pays the build, and none can be killed inside it. DeepSpeed's Adam ops are built by the first
run whose DeepSpeed JSON asks for them (the shipped configs take torch's AdamW). Run again, it
finds the ops built and only loads them.
"""

from __future__ import annotations

import sys

from advpt.command import command
from advpt.config.cli import parse
from advpt.config.tools import BuildExtensionsConfig


@command
def main(argv: list[str] | None = None) -> int:
    parse(BuildExtensionsConfig, argv, "advpt build-extensions")  # --help, --debug

    import torch

    from advpt.kernels import load_subset_sampler
    from advpt.native_builds import extensions_folder
    from advpt.training.distributed import SHM_OP, build_collectives_op

    built = []
    if build_collectives_op():
        built.append(SHM_OP)
    elif torch.cuda.is_available() and load_subset_sampler() is not None:
        built.append("advpt_subset_sampler")
    print(f"[advpt] {', '.join(built) or 'no op'} built in {extensions_folder()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
