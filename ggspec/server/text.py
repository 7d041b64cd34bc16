"""Token ids to text for one response: incremental UTF-8 decoding and stop strings.

A character split across tokens waits for its last byte. A stop string ends the text where it
begins (the stop string itself is not returned, as in OpenAI's API); while streaming, text that
may still turn into the start of a stop string is held back until it is clear either way, so a
streamed response and a whole one are the same text.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable


class TextStream:
    def __init__(self, token_bytes: Callable[[int], bytes], stops: Iterable[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = [s for s in stops if s]
        self.text = ""  # decoded so far (cut at a stop string once one is found)
        self._sent = 0  # characters of `text` already returned
        self.stopped = False  # a stop string was found
        self.stop_word = ""  # which one

    def push(self, tokens: Iterable[int]) -> str:
        """The text that can be sent after these tokens ('' while held back or once stopped)."""
        if self.stopped:
            return ""
        self.text += self._decoder.decode(b"".join(self._token_bytes(t) for t in tokens))
        return self._release(final=False)

    def finish(self) -> str:
        """What is left once generation ended: held-back text and an unfinished character."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        start = self._sent
        # a stop string begins at or after `start`: anything before it was released, so it was
        # not the beginning of one
        hits = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self.stops) if i >= 0]
        if hits:
            at, self.stop_word = min(hits)
            self.text = self.text[:at]
            self.stopped = True
            end = len(self.text)
        else:
            end = len(self.text) if final else len(self.text) - self._held(start)
        self._sent = end
        return self.text[start:end]

    def _held(self, start: int) -> int:
        """The longest tail of the unsent text that is the beginning of a stop string."""
        tail = self.text[start:]
        for n in range(min(len(tail), max((len(s) for s in self.stops), default=0) - 1), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.stops):
                return n
        return 0
