"""Build time: a TensorRT-LLM engine, a Hugging Face checkpoint or the demo -> one BentoML model.

Runs when `pack_model.py` runs, never while serving; it writes what serving reads through
`trtllm_service.packed_model`. `cli` reads the command line; `packer.pack` checks everything, then
writes the model, from `sources` (engine, checkpoint, tokenizer, chat template), `options` (the runtime
knobs), `model_name`, `adapters` (LoRA), `guided_decoding` (the C++ backend's xgrammar file) and
`copying`; `engine_build` runs trtllm-build, `demo_model` and `smollm2` make the demo checkpoints.
"""
