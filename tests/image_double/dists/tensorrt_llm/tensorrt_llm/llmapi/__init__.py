"""tensorrt_llm.llmapi of the image double: LLM, and the proxy session trtllm-llmapi-launch sets up."""

from tensorrt_llm.llmapi.llm import LLM

__all__ = ["LLM"]
