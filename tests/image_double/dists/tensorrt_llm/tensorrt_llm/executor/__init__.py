"""tensorrt_llm.executor of the image double."""

from tensorrt_llm.executor.request import LoRARequest

__all__ = ["LoRARequest"]
