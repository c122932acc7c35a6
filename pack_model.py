#!/usr/bin/env python3
"""Pack a Hugging Face checkpoint (or a TensorRT-LLM engine) into the BentoML model store.

The model holds the engine, the tokenizer and a filled Triton model repository, and nothing else. The
command line is ``trtllm_service.packing.cli``, the logic ``trtllm_service.packing`` (``packer.pack``).

Examples::

    python pack_model.py --hf-model hf/Meta-Llama-3-8B-Instruct --tp-size 2   # LLM API, no engine build
    python pack_model.py --demo                        # offline demo; --flavor ensemble for the ensemble

The llmapi flavour (above) is the default for every source it serves. A prebuilt TensorRT engine is
the legacy ensemble flavour's (images up to 26.07; packing one prints a warning line)::

    python pack_model.py --engine-dir engines/llama-3-8b-tp2 --tokenizer hf/Meta-Llama-3-8B-Instruct
    python pack_model.py --hf-model hf/Meta-Llama-3-8B-Instruct --build-engine  # trtllm-build, then as above

What `bentoml serve .` and `bentoml build` take (``trtllm_service.served_model.choose_served_model``):
TRTLLM_MODEL when set; else the served model recorded in $BENTOML_HOME/trtllm-service/served-model,
which the first pack into a store records, and then only ``--serve`` (this pack) or
``--set-served TAG`` (a model already packed) change; else the only packed model. Packing a second
model never changes what is served. The output ends with the commands that serve and build it.
"""

import sys

from trtllm_service.packing.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
