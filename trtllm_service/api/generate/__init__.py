"""`/generate`: a prompt (and a system prompt) through the chat template, its answer streamed as plain
text. Declared on the BentoML service (service.py: BentoML's clients and Swagger read its signature),
served like every other route by the shared generation path."""
