"""The model's version and the lock that inference and training share."""

from __future__ import annotations

import threading


class PolicyVersion:
    """The model's version (its optimizer steps so far), and the lock that keeps inference
    from reading a half-updated model."""

    def __init__(self):
        # Reentrant: a blocking trainer holds it across an update whose steps take it again.
        self.lock = threading.RLock()
        self.version = 0
