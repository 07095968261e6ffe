"""What the CLI accepts as a value, checked before anything is sent (issue 31).

Why here and not left to the API server or the SDK: tried as a new user would, bad input
came back as something else — ``--wait -1`` was taken as "no wait", ``--holder ''``
silently became the default identity, a namespace with a space answered "URL can't
contain control characters", a malformed selector ended ``work`` with a progress line.
Each function is an ``argparse`` type: it returns the parsed value or raises
``ArgumentTypeError`` with the reason, which the parser prints on one line with exit 2
(``joblease.cli.parser``). The rules are Kubernetes' own (DNS-1123 names, label
selectors as ``kubectl -l`` reads them) and the CRD's (a holder of at most 512
characters), so what passes here is never refused for its form by the API server.

Only the standard library: the parser imports this module at start-up (issue 18).
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

MAX_HOLDER = 512  # the CRD's status.holder maxLength
MAX_CLAIM_ID = 128  # the CRD's status.claimId maxLength
MAX_RESULT = 1024  # the CRD's status.completion.result maxLength
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_KEY = r"(?P<key>[^\s=!<>(),]+)"
_TERMS = (
    ("exists", re.compile(rf"^{_KEY}$")),
    ("absent", re.compile(rf"^!\s*{_KEY}$")),
    ("equals", re.compile(rf"^{_KEY}\s*(?P<op>==|=|!=)\s*(?P<value>[^\s=!<>(),]*)$")),
    ("compare", re.compile(rf"^{_KEY}\s*(?P<op>[<>])\s*(?P<value>[^\s=!<>(),]*)$")),
    ("set", re.compile(rf"^{_KEY}\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")),
)


def _fail(reason: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(reason)


def token(text: str) -> Any:
    """A whole fencing token, ``EPOCH/GENERATION`` as ``claim`` prints it."""
    from joblease.domain.token import FencingToken  # (pure and small; still only when used)
    try:
        return FencingToken.parse(text)
    except ValueError as err:
        raise _fail(str(err)) from None


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more (``--wait``, ``--grace``, ``--timeout``…)."""
    value = _number(text)
    if value < 0:
        raise _fail(f"must be 0 or more seconds, not {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (``--progress-every``: 0 would print in a loop)."""
    value = _number(text)
    if value <= 0:
        raise _fail(f"must be more than 0 seconds, not {text!r}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value):
        raise _fail(f"must be a finite number of seconds, not {text!r}")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more (``--top``, ``--events``, ``--epoch``, ``--generation``)."""
    value = _whole(text)
    if value < 0:
        raise _fail(f"must be 0 or more, not {text!r}")
    return value


def positive_count(text: str) -> int:
    """A whole number, 1 or more (``--concurrency``)."""
    value = _whole(text)
    if value < 1:
        raise _fail(f"must be at least 1, not {text!r}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _fail(f"not a whole number: {text!r}") from None


def holder(text: str) -> str:
    """A holder identity as written into the lease: not blank, at most 512 characters.

    Why refuse ``''``: an empty ``--holder`` used to become the default identity (the
    ``None`` of "not given"), so a script whose variable was unset held leases as
    ``HOSTNAME-PID`` without a word.
    """
    if not text.strip():
        raise _fail("must not be empty (leave the option out for the default identity)")
    if len(text) > MAX_HOLDER:
        raise _fail(f"at most {MAX_HOLDER} characters (the CRD's limit), not {len(text)}")
    return text


def claim_id(text: str) -> str:
    """A claim id as printed by ``claim``: not blank, at most 128 characters."""
    if not text.strip():
        raise _fail("must not be empty (leave the option out if you have none)")
    if len(text) > MAX_CLAIM_ID:
        raise _fail(f"at most {MAX_CLAIM_ID} characters (the CRD's limit), not {len(text)}")
    return text


def result(text: str) -> str:
    """A completion's result: at most 1,024 characters (else the API server refuses it)."""
    if len(text) > MAX_RESULT:
        raise _fail(f"at most {MAX_RESULT} characters (the CRD's limit), not {len(text)}")
    return text


def namespace(text: str) -> str:
    """A namespace name: a DNS-1123 label (lowercase letters, digits, '-'; at most 63)."""
    if len(text) > 63 or not _LABEL.match(text):
        raise _fail(f"not a namespace name (lowercase letters, digits and '-', starting and "
                    f"ending with a letter or digit, at most 63): {text!r}")
    return text


def lease_name(text: str) -> str:
    """A JobLease name: a DNS-1123 subdomain (as every object name; at most 253)."""
    if len(text) > 253 or not _SUBDOMAIN.match(text):
        raise _fail(f"not a JobLease name (lowercase letters, digits, '-' and '.', starting "
                    f"and ending with a letter or digit, at most 253): {text!r}")
    return text


def selector(text: str) -> str:
    """A label selector as ``kubectl -l`` reads it; returned unchanged.

    Terms separated by commas: ``key``, ``!key``, ``key=value`` (or ``==``), ``key!=value``,
    ``key in (a,b)``, ``key notin (a,b)``, ``key>N``, ``key<N``. Keys are label names with
    an optional DNS-subdomain prefix (``example.com/tier``); values are label values.
    """
    for term in _split_terms(text):
        reason = _term_problem(term.strip())
        if reason:
            raise _fail(f"not a label selector: {term.strip()!r} {reason}")
    return text


def _split_terms(text: str) -> list[str]:
    """The selector's terms: split at the commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for at, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise _fail(f"not a label selector: unbalanced ')' in {text!r}")
        elif char == "," and depth == 0:
            terms.append(text[start:at])
            start = at + 1
    if depth:
        raise _fail(f"not a label selector: unbalanced '(' in {text!r}")
    terms.append(text[start:])
    return [] if terms == [""] else terms


def _term_problem(term: str) -> str:
    """Why ``term`` is not a selector term, or ``''`` if it is one."""
    if not term:
        return "(an empty term: two commas, or one at an end)"
    for kind, pattern in _TERMS:
        match = pattern.match(term)
        if match is None:
            continue
        problem = _key_problem(match["key"])
        if problem:
            return problem
        if kind == "equals":
            return _value_problem(match["value"])
        if kind == "compare":
            return "" if re.fullmatch(r"\d{1,63}", match["value"]) else (
                f"(the value after {match['op']!r} must be a whole number, 0 or more)")
        if kind == "set":
            values = [v.strip() for v in match["values"].split(",")]  # "()": the API
            return next((p for p in map(_value_problem, values) if p), "")  # server takes it
        return ""
    return ("(want key, !key, key=value, key!=value, key in (a,b), key notin (a,b), "
            "key>N or key<N)")


def _key_problem(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"(the key's prefix {prefix!r} is not a DNS subdomain)"
    if len(name) > 63 or not _LABEL_NAME.match(name):
        return (f"(the key {name!r} is not a label name: letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit, at most 63)")
    return ""


def _value_problem(value: str) -> str:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (f"(the value {value!r} is not a label value: letters, digits, '-', '_' and "
                "'.', starting and ending with a letter or digit, at most 63)")
    return ""
