"""tensorrt_llm.llmapi.llm_utils of the image double: the stand-in's update_llm_args_with_extra_dict."""

from tensorrt_llm._standin import standin_attr

update_llm_args_with_extra_dict = standin_attr("update_llm_args_with_extra_dict")
