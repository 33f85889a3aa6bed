"""Eval episodes' records on the wire: a Problem's `episode_record` as one bounded JSON object.

A Problem whose learner writes its eval rounds' records (R2R's results files, say) has its
eval actors send each episode's record with the episode's stats. The record is JSON, never
pickle: the learner parses data, not objects, refuses anything over `MAX_RECORD_BYTES`, and
leaves the record's shape to `Problem.check_episode_record`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetrl.proto.tensors import WireError

# An R2R trajectory of 30 viewpoints is about 2 KiB; a record is a summary, not a replay.
MAX_RECORD_BYTES = 64 * 1024


def encode_record(record: Mapping[str, Any]) -> bytes:
    """The record as compact UTF-8 JSON; a ValueError names a record that cannot travel."""
    try:
        data = json.dumps(record, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ValueError(f"an episode record must be a JSON object of finite numbers, strings and lists: {e}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"an episode record of {len(data):,} bytes is over the limit of {MAX_RECORD_BYTES:,}; "
                         "keep Problem.episode_record to a summary of the episode")
    return data


def decode_record(data: bytes, field: str) -> dict[str, Any]:
    """The JSON object in `data`, or a WireError that names `field` and what is wrong."""
    if len(data) > MAX_RECORD_BYTES:
        raise WireError(f"{field}: a record of {len(data):,} bytes is over the limit of {MAX_RECORD_BYTES:,}")
    try:
        record = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError(f"{field}: not a UTF-8 JSON object of finite values ({type(e).__name__}: {e})") from None
    if not isinstance(record, dict):
        raise WireError(f"{field}: a record must be a JSON object, got {type(record).__name__}")
    return record


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")
