"""tensorrt_llm.serve of the image double: what the real package's import needs of openai.

The real `tensorrt_llm.serve` (its OpenAI protocol module) imports the Responses API's reasoning
part type; openai 1.107.3 (NVIDIA's 26.07 image) lacks it, 1.109.1 and later have it, so loading a
model in the image fails unless openai is upgraded.
"""

from openai.types.responses.response_content_part_added_event import PartReasoningText  # noqa: F401
