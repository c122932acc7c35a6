"""Build time: a TensorRT-LLM engine, a Hugging Face checkpoint or the demo -> one BentoML model.

Runs when `pack_model.py` runs, never while serving; it writes what serving reads through
`trtllm_service.packed_model`.
"""
