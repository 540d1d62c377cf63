"""Cron expressions as KFP's scheduler takes them, checked before anything is sent.

KFP's ScheduledWorkflow controller parses cron with robfig/cron and a *seconds* field first:
``sec min hour day-of-month month day-of-week``. People write the usual five fields
(``0 2 * * *``); :func:`to_kfp_cron` prepends ``0`` seconds. Each field is checked for range
and syntax (``*``, ``?``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, ``a/n``, lists, month and
weekday names) so a typo fails here with the field named, not later on the server or, worse,
as a schedule that never fires.
"""

from __future__ import annotations

import re

from draslice.errors import InvalidParameter

_FIELDS = (
    ("second", 0, 59, None),
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                      "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day-of-week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_DURATION = re.compile(r"^(\d+)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _value(token: str, lo: int, hi: int, names, field: str, expr: str) -> int:
    upper = token.upper()
    if names and upper in names:
        return names.index(upper) + (1 if field == "month" else 0)
    if not token.isdigit():
        raise InvalidParameter("--cron", expr, f"{field} field: {token!r} is not a number"
                               + (f" or one of {', '.join(names)}" if names else ""))
    n = int(token)
    if not lo <= n <= hi:
        raise InvalidParameter("--cron", expr, f"{field} field: {n} is outside {lo}-{hi}")
    return n


def _check_field(text: str, field: str, lo: int, hi: int, names, expr: str) -> None:
    for part in text.split(","):
        if not part:
            raise InvalidParameter("--cron", expr, f"{field} field: empty list item")
        base, slash, step = part.partition("/")
        if slash and (not step.isdigit() or int(step) == 0):
            raise InvalidParameter("--cron", expr, f"{field} field: step {step!r} must be a "
                                   "positive number")
        if base in ("*", "?"):
            if base == "?" and field not in ("day-of-month", "day-of-week"):
                raise InvalidParameter("--cron", expr, f"{field} field: '?' is only allowed "
                                       "for day-of-month and day-of-week")
            continue
        first, dash, last = base.partition("-")
        a = _value(first, lo, hi, names, field, expr)
        if dash:
            b = _value(last, lo, hi, names, field, expr)
            if b < a:
                raise InvalidParameter("--cron", expr, f"{field} field: range {base} runs "
                                       "backwards")


def to_kfp_cron(expr: str) -> str:
    """A valid 6-field (seconds first) cron for KFP, from a 5- or 6-field expression."""
    text = " ".join(str(expr).split())
    if text.lower() in DESCRIPTORS:
        return text.lower()
    fields = text.split(" ")
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise InvalidParameter(
            "--cron", expr,
            f"has {len(fields)} fields; give 5 (minute hour day-of-month month day-of-week, "
            "e.g. '0 2 * * *' for 02:00 daily) or KFP's 6 with seconds first, or one of "
            + ", ".join(DESCRIPTORS),
        )
    for value, (field, lo, hi, names) in zip(fields, _FIELDS, strict=True):
        _check_field(value, field, lo, hi, names, expr)
    return " ".join(fields)


def parse_interval(text: str) -> int:
    """Seconds from ``90``, ``90s``, ``30m``, ``6h`` or ``1d``; at least 60 seconds."""
    raw = str(text).strip().lower()
    if raw.isdigit():
        seconds = int(raw)
    else:
        m = _DURATION.match(raw)
        if not m:
            raise InvalidParameter("--every", text, "use seconds or a number with s, m, h or d "
                                   "(e.g. 6h, 30m, 1d)")
        seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds < 60:
        raise InvalidParameter("--every", text, "must be at least 60 seconds")
    return seconds
