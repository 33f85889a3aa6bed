"""The learner's own inference failures, told apart from an actor's bad message.

A step reaches inference only after every check of the actor's message has passed
(`wire_messages`), so a forward pass that raises (a CUDA out-of-memory, a bug in the
learner or in the Problem's agent) is the learner's failure, not the actor's: its stream is
answered UNAVAILABLE, which the actor takes as "back off, reconnect and resend", and the
learner logs the traceback. One such failure is often transient (an out-of-memory spike);
a failure that repeats for every connected actor, with no step served in between, is not:
the run stops with the learner's error, instead of every actor retrying for ever.
"""

from __future__ import annotations

import threading


class InferenceFailures:
    def __init__(self, repeats: int = 2):
        """The run stops once each connected actor's steps failed `repeats` times in a row
        (all actors together, since the last step served)."""
        self.repeats = repeats
        self.total = 0
        self._lock = threading.Lock()
        self._since_success: dict[str, int] = {}

    def served(self) -> None:
        """A step was served: what failed before was transient."""
        if self._since_success:
            with self._lock:
                self._since_success.clear()

    def failed(self, actor: str, connected: int) -> bool:
        """Records a failure on `actor`'s step; True when the run should stop: every one of the
        `connected` actors has failed `repeats` times since the last step served."""
        with self._lock:
            self.total += 1
            self._since_success[actor] = self._since_success.get(actor, 0) + 1
            failing = [n for n in self._since_success.values() if n >= self.repeats]
            return len(failing) >= max(connected, 1)
