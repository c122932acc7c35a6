"""The HTTP server's plumbing, whatever the endpoint: auth, limits, error shapes, streamed bodies,
metrics, tracing, start-up and shutdown, and the fixes to BentoML."""
