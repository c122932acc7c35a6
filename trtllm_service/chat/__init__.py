"""The chat format, shared by every phase: the chat template (pack time checks it, the relay renders
it) and tool calls (rendered into prompts, parsed out of answers)."""
