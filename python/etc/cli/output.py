"""What the command line prints besides the text: progress bars while a model
loads (tqdm on stderr) and errors as one line."""

from __future__ import annotations

import sys
import threading
from typing import Optional


class Progress:
    """`etc.models.load`'s progress callback drawn as tqdm bars on stderr:
    a bar over the weights' tensors, then the elapsed time of the step
    kernel's compilation (or of its load from the cache)."""

    _TITLES = {"cache": "looking up the step kernel in the compile cache",
               "compile": "compiling the step kernel"}

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None
        self._phase = None
        self._ticker: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self._phase:
            self.close()
            self._phase = phase
            if phase == "weights":
                self._bar = tqdm(total=total, desc="loading weights", unit="tensor",
                                 file=sys.stderr, leave=False, dynamic_ncols=True)
            else:
                self._bar = tqdm(total=total, desc=self._TITLES.get(phase, phase),
                                 bar_format="{desc}: {elapsed}", file=sys.stderr,
                                 leave=False)
                # Compiling has no steps to count: redraw the elapsed time.
                self._stop.clear()
                self._ticker = threading.Thread(target=self._tick, daemon=True)
                self._ticker.start()
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._phase = None


def one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, KeyError) and text.startswith("'") and text.endswith("'"):
        text = text[1:-1]
    return " ".join(text.split())
