"""Stop strings: what a request's detokenized text may send, and whether it
reached a stop string (checked on the host after each new token)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["StopChecker"]


class StopChecker:
    """The stop strings of one request, checked on its detokenized text:
    `feed(text)` returns the text that may be sent (holding back a tail
    that could begin a stop string) and whether a stop string appeared
    (the text returned then ends just before it, as in OpenAI's API, or
    just after it with `include_stop`: vLLM's include_stop_str_in_output)."""

    def __init__(self, stop: Sequence[str], include_stop: bool = False):
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop
        self._longest = max((len(s) for s in self.stop), default=0)
        self._text = ""   # everything seen
        self._sent = 0    # characters of it returned

    def feed(self, text: str, final: bool = False) -> tuple[str, bool]:
        start = max(0, len(self._text) - self._longest + 1)
        self._text += text
        if self.stop:
            found = [i for i in (self._text.find(s, start) for s in self.stop) if i >= 0]
            if found:
                end = min(found)
                if self.include_stop:
                    # The earliest stop string that begins there (the
                    # longest of those: the text it completed).
                    end += max(len(s) for s in self.stop if self._text.startswith(s, end))
                out = self._text[self._sent:end] if end > self._sent else ""
                self._sent = max(self._sent, end)
                return out, True
        end = len(self._text)
        if not final:
            # Hold back the longest tail that is a proper prefix of a stop.
            for k in range(min(self._longest - 1, end - self._sent), 0, -1):
                tail = self._text[end - k:]
                if any(s.startswith(tail) for s in self.stop):
                    end -= k
                    break
        out = self._text[self._sent:end]
        self._sent = end
        return out, False
