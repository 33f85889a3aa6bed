"""Optional features and the pip extras that bring their dependencies.

A feature whose packages are missing raises `MissingExtra`, an ImportError whose message
names the extra to install; the launchers print it as one line and exit non-zero.
"""

from __future__ import annotations


class MissingExtra(ImportError):
    """A feature's optional dependencies are not installed."""

    def __init__(self, feature: str, extra: str, cause: BaseException | None = None, how: str = ""):
        how = how or f"pip install 'fleetrl[{extra}]'"
        super().__init__(f"{feature} needs the {extra!r} extra: {how}" + (f" ({cause})" if cause else ""))
        self.extra = extra
