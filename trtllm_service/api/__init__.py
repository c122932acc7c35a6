"""Speaking HTTP, by role: `server` (the plumbing: auth, limits, error shapes, streamed bodies,
metrics, tracing, start-up and shutdown, BentoML's fixes; it knows no endpoint), `generation` (the
path every endpoint shares and their common protocol), one package per endpoint family (`openai`,
`anthropic`, `generate`, which never import each other), and `app` (and `openapi`), which assemble
them. Everything here sits on top of the runtime and the relay."""
