"""Relaying tokens: a request settled once, templated and tokenized, sent to Triton's `tensorrt_llm`
model over gRPC, and its tokens back as text."""
