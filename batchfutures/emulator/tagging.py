"""AWS Batch's tag rules, as Batch checks them on every call that takes tags.

    at most 50 tags on a resource (TagResource counts the ones it keeps too)
    a key: 1-128 characters, a value: 0-256, both of letters, digits, spaces and _ . : / = + - @
    keys starting with ``aws:`` (any case) are AWS's own: they cannot be set or removed

Each check returns the ClientException message for what Batch refuses, or None.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Mapping, Optional

MAX_TAGS = 50
MAX_KEY = 128
MAX_VALUE = 256
_ALLOWED = re.compile(r"^[\w\s.:/=+\-@]*$")  # Unicode letters, digits, spaces, _ . : / = + - @


def check_tags(tags: Optional[Mapping[str, str]], *, limit: Optional[int] = MAX_TAGS) -> Optional[str]:
    """The message for tags Batch refuses (``limit`` None: the count is not checked here)."""
    if not tags:
        return None
    if limit is not None and len(tags) > limit:
        return f"tags: a resource takes at most {limit} tags, got {len(tags)}"
    for key, value in tags.items():
        problem = check_key(key)
        if problem:
            return problem
        if len(value) > MAX_VALUE:
            return f"tag value of {key!r} is longer than {MAX_VALUE} characters"
        if not _ALLOWED.fullmatch(value):
            return (f"tag value of {key!r} may only hold letters, digits, spaces and "
                    "_ . : / = + - @")
    return None


def check_key(key: str) -> Optional[str]:
    if not 1 <= len(key) <= MAX_KEY:
        return f"tag key {key[:MAX_KEY]!r} must be 1 to {MAX_KEY} characters"
    if not _ALLOWED.fullmatch(key):
        return f"tag key {key!r} may only hold letters, digits, spaces and _ . : / = + - @"
    if key.lower().startswith("aws:"):
        return f"tag key {key!r}: keys starting with aws: are reserved for AWS use"
    return None


def check_keys(keys: Iterable[str]) -> Optional[str]:
    for key in keys:
        problem = check_key(key)
        if problem:
            return problem
    return None


def tagged(current: Mapping[str, str], added: Mapping[str, str]) -> Dict[str, str]:
    """TagResource: the resource's tags with ``added`` (new values win)."""
    merged = dict(current)
    merged.update(added)
    return merged


def untagged(current: Mapping[str, str], keys: Iterable[str]) -> Dict[str, str]:
    """UntagResource: the resource's tags without ``keys`` (absent keys are no error)."""
    drop = set(keys)
    return {key: value for key, value in current.items() if key not in drop}
