"""tensorrt_llm.sampling_params of the image double: the stand-in's classes."""

from tensorrt_llm._standin import standin_attr

SamplingParams = standin_attr("SamplingParams")
GuidedDecodingParams = standin_attr("GuidedDecodingParams")
