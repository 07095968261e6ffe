"""Hypothesis strategies for JobLease objects as the API server may store them.

Why from the CRD itself: the operator, the SDK and the CLI read whatever the API server
stored, and the API server stores anything its schema accepts — not only what joblease
writes. Anyone with RBAC on ``jobleases/status`` (or an older/newer joblease, or a person
with ``kubectl edit --subresource=status``) can write any schema-valid status. So the
objects below are generated from ``crds/joblease.dev_jobleases.yaml``'s own
``openAPIV3Schema`` with hypothesis-jsonschema, adjusted to what the server *stores*:

* ``format: date-time`` is generated as kube-openapi's ``strfmt.IsDateTime`` accepts it
  (``pkg/validation/strfmt/time.go`` at the version the local control plane is built
  from, d427ff9): the string is lower-cased and split at ``t``; the part before must be a
  Go ``time.Parse("2006-01-02")`` date (any year 0000–9999, real calendar days); the part
  after the first ``t`` must match
  ``^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$`` with
  hour <= 23, minute <= 59, second <= 59. Hence: ``T`` or ``t``, ``Z`` or ``z``, offsets
  with *any* two-digit hours and minutes (``+99:99``), fractions of any length, and — the
  ``.`` is unescaped — any one character before the fraction digits; anything after a
  *second* ``t`` is never looked at. :func:`kube_openapi_is_date_time` is that check
  ported, and a test holds the generator to it.
* ``format: int32`` / ``int64`` bound integers (kube-openapi's numberValidator enforces
  them at that version; JSON integers beyond int64 do not decode as integers at all).
* Structural pruning: the CRD has no ``x-kubernetes-preserve-unknown-fields``, so unknown
  fields are dropped on write: objects are generated with ``additionalProperties: false``.
* Defaulting: ``spec.leaseDurationSeconds`` has ``default: 30``, which the server applies
  on read; objects come with it applied (and the parser is also fed objects without it).
* ``x-kubernetes-list-type: map`` with ``x-kubernetes-list-map-keys: [type]`` on
  ``status.conditions``: the server refuses two items with the same ``type``, so lists are
  de-duplicated by ``type``.
* ``x-kubernetes-validations`` on ``status`` are all *transition* rules (``oldSelf``): they
  restrict single writes, not which states are reachable — every schema-valid status can
  be reached from an empty one by a sequence of writes that each satisfy them (raise the
  generation one claim at a time with a holder, then set the rest). So they filter nothing.
* Go's RE2 ``$`` matches only at the end of the text, Python's also before a final newline:
  schema patterns are generated with ``\\Z`` so no value the server would refuse appears.
"""

from __future__ import annotations

import calendar
import copy
import functools
import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "joblease.dev_jobleases.yaml"
K8S_DATE_TIME = "k8s-date-time"  # our name: hypothesis-jsonschema refuses to redefine date-time

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

# --- kube-openapi's date-time acceptance, ported --------------------------------------------

_RX_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))",
                      re.DOTALL)


def _go_is_date(text: str) -> bool:
    """Go's ``time.Parse("2006-01-02", text) == nil`` (fixed widths, real calendar days)."""
    m = re.fullmatch(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", text)
    if not m:
        return False
    year, month, day = (int(g) for g in m.groups())
    if not 1 <= month <= 12:
        return False
    return 1 <= day <= _days_in(year, month)


def _days_in(year: int, month: int) -> int:
    # Go's proleptic Gregorian calendar: year 0 is a leap year (Python's calendar agrees
    # for the arithmetic, though datetime cannot represent year 0).
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 29 if month == 2 and leap else calendar.mdays[month]


def kube_openapi_is_date_time(text: str) -> bool:
    """``strfmt.IsDateTime`` (kube-openapi pkg/validation/strfmt/time.go), ported.

    Go's regexp ``.`` matches any character but ``\\n``; ``[0-9]`` is ASCII only.
    """
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not _go_is_date(parts[0]):
        return False
    m = _RX_TIME.fullmatch(parts[1])
    if m is None or (m.group(4) is not None and "\n" in m.group(4)[0]):
        return False
    return m.group(1) <= "23" and m.group(2) <= "59" and m.group(3) <= "59"


# --- date-time generation ---------------------------------------------------------------------

# The first element of each choice is the plain case, so shrinking leads to the one
# feature that matters (Hypothesis shrinks towards the first alternative).
_EDGE_YEARS = [2026, 0, 1, 2, 1969, 1970, 9998, 9999]
FEATURES = ("years", "case", "fraction", "separator", "offset", "tail", "edges")


@st.composite
def _dates(draw: st.DrawFn, all_years: bool) -> str:
    years = st.one_of(st.sampled_from(_EDGE_YEARS), st.integers(0, 9999)) if all_years \
        else st.integers(2026, 2100)
    year = draw(years)
    month = draw(st.one_of(st.sampled_from([12, 1, 2]), st.integers(1, 12)))
    last = _days_in(year, month)
    day = draw(st.one_of(st.sampled_from([1, last]), st.integers(1, last)))
    return f"{year:04d}-{month:02d}-{day:02d}"


def _two(lo: int, hi: int, edges: list[int]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi)).map(lambda n: f"{n:02d}")


# Any one character the Go regexp's unescaped '.' accepts, except t/T (the split point).
_FRACTION_SEPARATORS = st.one_of(
    st.sampled_from([",", ":", " ", "x", "Z", "+", "é", "\u00a0", "·"]),
    st.characters(exclude_characters="\ntT", exclude_categories=["Cs"]))
# Whole timestamps at the ends of the representable range (and of the server's).
_EDGE_STAMPS = ["9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59Z", "9999-12-31T23:59:59-23:59",
                "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+23:59", "0000-01-01T00:00:00Z",
                "1970-01-01T00:00:00Z"]


@st.composite
def k8s_date_times(draw: st.DrawFn, *, only: str | None = None) -> str:
    """A string the API server accepts for ``format: date-time`` (see the module doc).

    Every feature below varies by default; ``only=FEATURE`` varies just that one and keeps
    the rest plain (``2026..2100``, ``T``, ``Z``, no fraction), so a failure names its
    cause: ``years`` (0000–9999), ``case`` (``t``/``z``), ``fraction`` (any length),
    ``separator`` (any character for the fraction's ``.``), ``offset`` (``+HH:MM`` with any
    two digits, ``+99:99``), ``tail`` (text after a second ``t``), ``edges`` (whole
    timestamps at the ends of the range).
    """
    def on(feature: str) -> bool:
        return only is None or only == feature

    if on("edges") and (only == "edges" or draw(st.integers(0, 9)) == 9):
        return draw(st.sampled_from(_EDGE_STAMPS))
    date = draw(_dates(on("years")))
    sep = draw(st.sampled_from("Tt")) if on("case") else "T"
    clock = ":".join((draw(_two(0, 23, [12, 0, 23])), draw(_two(0, 59, [0, 59])),
                      draw(_two(0, 59, [0, 59]))))
    fraction = ""
    if (on("fraction") or on("separator")) and (only is not None or draw(st.booleans())):
        dot = draw(_FRACTION_SEPARATORS) if only == "separator" or (
            only is None and draw(st.booleans())) else "."
        digits = draw(st.one_of(st.sampled_from(["000", "5", "999", "999999", "9999999999"]),
                                st.text("0123456789", min_size=1, max_size=40)))
        fraction = dot + digits
    if on("offset") and (only == "offset" or draw(st.booleans())):
        zone = (draw(st.sampled_from("+-")) + draw(_two(0, 99, [0, 1, 14, 23, 24, 99]))
                + ":" + draw(_two(0, 99, [0, 30, 59, 60, 99])))
    else:
        zone = draw(st.sampled_from("Zz")) if on("case") else "Z"
    tail = ""
    if on("tail") and (only == "tail" or draw(st.integers(0, 9)) == 9):
        tail = draw(st.sampled_from("tT")) + draw(st.text(max_size=8))
    return f"{date}{sep}{clock}{fraction}{zone}{tail}"


# --- the CRD schema, adjusted to what the server stores --------------------------------------

def crd_schema() -> dict[str, Any]:
    """The v1alpha1 ``openAPIV3Schema`` exactly as in the CRD file."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _adjust(node: dict[str, Any]) -> dict[str, Any]:
    """One schema node, adjusted (see the module doc); ``properties`` keep every name."""
    out = {k: v for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k not in ("description", "default")}
    if "properties" in out:
        out["properties"] = {name: _adjust(sub) for name, sub in out["properties"].items()}
    if "items" in out:
        out["items"] = _adjust(out["items"])
    if out.get("format") == "date-time":
        out["format"] = K8S_DATE_TIME
    if out.get("type") == "integer":
        lo, hi = INT32 if out.get("format") == "int32" else INT64
        out["minimum"] = max(out.get("minimum", lo), lo)
        out["maximum"] = min(out.get("maximum", hi), hi)
    if out.get("format") in ("int32", "int64"):
        del out["format"]
    if "pattern" in out:
        out["pattern"] = out["pattern"].removesuffix("$") + r"\Z"
    if out.get("type") == "object" and "properties" in out:
        out["additionalProperties"] = False  # structural pruning
    return out


@functools.cache
def _body_strategy(only: str | None) -> st.SearchStrategy[dict[str, Any]]:
    return from_schema(generation_schema(),
                       custom_formats={K8S_DATE_TIME: k8s_date_times(only=only)})


def generation_schema() -> dict[str, Any]:
    """The CRD schema for ``spec`` and ``status`` (metadata is generated separately)."""
    schema = copy.deepcopy(crd_schema())
    props = schema["properties"]
    props.pop("metadata")
    props.pop("apiVersion")
    props.pop("kind")
    return _adjust(schema)


def _dedupe_conditions(status: dict[str, Any]) -> dict[str, Any]:
    conditions = status.get("conditions")
    if conditions:
        seen: dict[str, dict[str, Any]] = {}
        for item in conditions:
            seen.setdefault(item["type"], item)
        status["conditions"] = list(seen.values())
    return status


_NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@st.composite
def lease_objects(draw: st.DrawFn, *, only: str | None = None, apply_defaults: bool = True
                  ) -> dict[str, Any]:
    """A whole JobLease object as a GET could return it (schema-valid spec and status).

    ``only`` is passed to :func:`k8s_date_times` for every timestamp in it.
    """
    body = copy.deepcopy(draw(_body_strategy(only)))
    spec = body.setdefault("spec", {})
    if apply_defaults:
        spec.setdefault("leaseDurationSeconds", 30)
    if "status" in body:
        _dedupe_conditions(body["status"])
    body["apiVersion"] = "joblease.dev/v1alpha1"
    body["kind"] = "JobLease"
    body["metadata"] = {
        "name": draw(_NAMES), "namespace": draw(_NAMES),
        "uid": draw(st.uuids()).hex, "resourceVersion": str(draw(st.integers(1, 2**40))),
        "generation": draw(st.integers(1, 2**31)),
        "creationTimestamp": "2026-12-03T12:00:00Z",
    }
    return body


def annotation_values() -> st.SearchStrategy[str]:
    """Any annotation value (a string; the API server puts no format on them)."""
    return st.one_of(st.text(max_size=30), st.integers(-(2**70), 2**70).map(str),
                     k8s_date_times(), st.sampled_from(["", " 7", "+3", "٣", "1_000", "0x10"]))
