#!/usr/bin/env python3
"""Start tritonserver (mpirun for world_size > 1) and supervise it: ``--help`` lists the options.

The entry point that users, the service and mpirun's ranks run by path; the logic is
``tensorrtllm_backend/launcher.py``. Run by path, ``sys.path[0]`` is this folder, so the tree that
holds it (a checkout, or the bento's src) goes first on the path: its package is the one imported.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tensorrtllm_backend.launcher import main

    sys.exit(main())
