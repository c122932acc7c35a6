"""tensorrt_llm.executor.request of the image double: the stand-in's LoRARequest."""

from tensorrt_llm._standin import standin_attr

LoRARequest = standin_attr("LoRARequest")
