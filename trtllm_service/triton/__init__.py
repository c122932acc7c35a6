"""Supervision of Triton: the one owner that spawns, watches, restarts and stops tritonserver, and the
other workers that find it."""
