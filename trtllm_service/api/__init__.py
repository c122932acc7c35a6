"""Speaking HTTP: the OpenAI-compatible routes, streaming bodies, auth, limits, metrics and the
BentoML-side fixes; everything here sits on top of the relay."""
