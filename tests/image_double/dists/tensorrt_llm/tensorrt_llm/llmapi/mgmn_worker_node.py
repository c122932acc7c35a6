"""The double's worker node (ranks > 0): the double has one GPU's worth of nothing, so it only waits
until its launcher stops it."""

import signal

signal.pause()
