"""The generation path every endpoint shares: the serving base, its choices, SSE frames and request
bodies."""
