"""Stop strings, matched on streamed text.

A stop string has no unique token sequence (the string -> token-id mapping is not unique), so it is
matched on the decoded text: the stream ends where the first stop string completes, and no text that
is, or may still become, a stop string is ever emitted.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_STOP_STRINGS = 16


class StopStringError(ValueError):
    """Stop strings a request may not use. `index` is the offending entry (None: the whole list)."""

    def __init__(self, message: str, code: str, index: int | None = None) -> None:
        super().__init__(message)
        self.code = code  # OpenAI's error code: invalid_type or invalid_value
        self.index = index


def check_stop(stops: Sequence[object]) -> tuple[str, ...]:
    """The one rule for stop strings: at most MAX_STOP_STRINGS non-empty strings; duplicates dropped."""
    if len(stops) > MAX_STOP_STRINGS:
        raise StopStringError(f"At most {MAX_STOP_STRINGS} stop strings are allowed.", "invalid_value")
    for i, stop in enumerate(stops):
        if not isinstance(stop, str):
            raise StopStringError("Stop strings must be strings.", "invalid_type", i)
        if not stop:
            raise StopStringError("Stop strings must not be empty.", "invalid_value", i)
    return tuple(dict.fromkeys(stops))  # type: ignore[arg-type]  # every one a str: checked above


class StopStringMatcher:
    """Streaming stop-string detection on text deltas.

    Text that is, or might become, a stop string is never emitted: the longest suffix of the text seen so
    far that is a prefix of some stop string is held back until it either completes a stop string or
    stops being a possible one. The stream stops at the first position where any stop string is
    complete; when several end there, the longest wins (it starts earliest). This is what a streaming
    engine observes, and it does not depend on how the text is split into deltas.

    Matching runs an Aho-Corasick automaton whose state persists across deltas, so one ``push`` costs
    O(len(delta) + longest stop string), however long the stream already is. The automaton's state is
    exactly the held-back suffix, so no text is ever re-scanned.

    Args:
        stops: Stop strings, as `check_stop` returns them. Duplicates are harmless.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._active = bool(stops)
        self._pending = ""
        self._state = 0
        self.stopped = False  # a stop string was found: the caller should end the stream
        self.matched: str | None = None  # the stop string that ended the stream
        self._build(stops)

    def _build(self, stops: Sequence[str]) -> None:
        """Build the trie (goto), failure links, state depths and longest-match-ending-here lengths."""
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        terminal = [False]
        for stop in stops:
            state = 0
            for ch in stop:
                nxt = goto[state].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[state][ch] = nxt
                    goto.append({})
                    depth.append(depth[state] + 1)
                    terminal.append(False)
                state = nxt
            terminal[state] = True
        fail = [0] * len(goto)
        # match_len[s]: length of the longest stop string that is a suffix of state s's text (0 if none).
        match_len = [depth[s] if terminal[s] else 0 for s in range(len(goto))]
        queue = list(goto[0].values())
        for state in queue:  # breadth-first: parents before children, so fail[] is ready when read
            for ch, child in goto[state].items():
                f = fail[state]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(ch, 0)  # f is shallower than state, so never child itself
                if not terminal[child]:
                    match_len[child] = match_len[fail[child]]
                queue.append(child)
        self._goto, self._fail, self._depth, self._match_len = goto, fail, depth, match_len

    def push(self, delta: str) -> tuple[str, bool]:
        """Feed the next text delta.

        Returns:
            ``(text safe to emit now, stopped)``. When ``stopped`` is True the text is everything before
            the stop string, and later calls return ``("", True)``.
        """
        if not self._active:
            return delta, False
        if self.stopped:
            return "", True
        goto, fail, match_len = self._goto, self._fail, self._match_len
        text = self._pending + delta
        base = len(self._pending)
        state = self._state
        for i, ch in enumerate(delta):
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            length = match_len[state]
            if length:
                end = base + i + 1
                self.stopped = True
                self.matched = text[end - length : end]
                self._pending = ""
                return text[: end - length], True
        self._state = state
        hold = self._depth[state]
        cut = len(text) - hold
        self._pending = text[cut:]
        return text[:cut], False

    def flush(self) -> str:
        """Return the held-back text at the end of the stream (empty after a stop)."""
        text, self._pending = self._pending, ""
        self._state = 0
        return "" if self.stopped else text
