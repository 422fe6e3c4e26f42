"""Batch's retry strategy: validating `retryStrategy` and matching `evaluateOnExit` rules.

A failed attempt is retried while attempts remain and the first rule whose conditions all match
says RETRY; a rule saying EXIT stops; when no rule matches, Batch retries. Patterns match the
whole string case-insensitively, or a prefix when they end with `*`.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional

MAX_ATTEMPTS = 10
MAX_RULES = 5
_EXIT_CODE_PATTERN = re.compile(r"^[0-9]*\*?$")
_REASON_PATTERN = re.compile(r"^[A-Za-z0-9.:\s]*\*?$")


def check_strategy(strategy: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The ClientException message for an invalid retryStrategy, or None when it is valid."""
    if not strategy:
        return None
    attempts = strategy.get("attempts")
    if attempts is not None and not 1 <= attempts <= MAX_ATTEMPTS:
        return f"retryStrategy.attempts must be between 1 and {MAX_ATTEMPTS}, got {attempts}"
    rules = strategy.get("evaluateOnExit") or []
    if len(rules) > MAX_RULES:
        return f"retryStrategy.evaluateOnExit takes at most {MAX_RULES} rules, got {len(rules)}"
    for rule in rules:
        if str(rule.get("action", "")).upper() not in ("RETRY", "EXIT"):
            return f"evaluateOnExit action must be RETRY or EXIT, got {rule.get('action')!r}"
        code = rule.get("onExitCode")
        if code is not None and (len(code) > 512 or not _EXIT_CODE_PATTERN.fullmatch(code)):
            return f"evaluateOnExit onExitCode {code!r} must be digits, optionally ending with '*'"
        for key in ("onReason", "onStatusReason"):
            value = rule.get(key)
            if value is not None and (len(value) > 512 or not _REASON_PATTERN.fullmatch(value)):
                return (f"evaluateOnExit {key} {value!r} may contain letters, digits, periods, "
                        "colons and white space, optionally ending with '*'")
    return None


def normalized(strategy: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """A copy with actions in upper case, as Batch shows them (it accepts any case)."""
    if not strategy:
        return None
    copy: Dict[str, Any] = {k: v for k, v in strategy.items() if k != "evaluateOnExit"}
    if strategy.get("evaluateOnExit") is not None:
        copy["evaluateOnExit"] = [dict(rule, action=str(rule.get("action", "")).upper())
                                  for rule in strategy["evaluateOnExit"]]
    return copy


def matches(pattern: Optional[str], value: Optional[str]) -> bool:
    """A condition absent from the rule matches anything."""
    if pattern is None:
        return True
    pattern, value = pattern.lower(), (value or "").lower()
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return value == pattern


def should_retry(rules: List[Dict[str, str]], *, exit_code: Optional[int],
                 reason: Optional[str], status_reason: Optional[str]) -> bool:
    """What the rules say about a failed attempt (attempts left are checked by the caller)."""
    for rule in rules:
        if (matches(rule.get("onExitCode"), None if exit_code is None else str(exit_code))
                and matches(rule.get("onReason"), reason)
                and matches(rule.get("onStatusReason"), status_reason)):
            return str(rule.get("action", "")).upper() == "RETRY"
    return True
