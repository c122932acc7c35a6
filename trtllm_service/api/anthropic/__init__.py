"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): its requests
(`protocol`), its answers and stream events (`events`) and its error shape (`errors`)."""
