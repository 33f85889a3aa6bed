"""The shared token that learners and actors authenticate calls with.

The token travels as call metadata, `authorization: Bearer <token>`, on every call. It is
read from a file (`--auth_token_file`) or from the FLEETRL_AUTH_TOKEN environment variable,
never from a flag value, so it stays out of process listings. Without TLS anyone on the
path can read it: across untrusted networks use both (see the README).
"""

from __future__ import annotations

import os

METADATA_KEY = "authorization"
ENV_VAR = "FLEETRL_AUTH_TOKEN"


def read_token(path: str) -> str | None:
    """The token from `path`, else from $FLEETRL_AUTH_TOKEN, else None (no authentication)."""
    if path:
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as e:
            raise ValueError(f"cannot read the auth token file {path}: {e.strerror}") from None
        if not token:
            raise ValueError(f"the auth token file {path} is empty")
        return token
    return os.environ.get(ENV_VAR) or None


def bearer(token: str) -> str:
    return f"Bearer {token}"
