"""OpenAI's API as this server speaks it: models, chat and text completions, responses (one package
each), vLLM's /tokenize and /detokenize; over the shared generation path (`api.generation`)."""
