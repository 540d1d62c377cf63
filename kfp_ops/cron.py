"""Cron expressions as KFP's scheduler takes them, checked before anything is sent.

KFP's ScheduledWorkflow controller parses cron with robfig/cron and a *seconds* field first:
``sec min hour day-of-month month day-of-week``. People write the usual five fields
(``0 2 * * *``); :func:`to_kfp_cron` prepends ``0`` seconds. Each field is checked for range
and syntax (``*``, ``?``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, ``a/n``, lists, month and
weekday names) so a typo fails here with the field named, not later on the server.

What the controller then makes of a cron is :class:`RobfigSchedule`: robfig/cron v1.2.0's
``cron.Parse`` (its errors word for word, which is what KFP's API server answers a bad cron
with) and its ``Schedule.Next``, in UTC, the controller's usual zone. :func:`kfp_schedule`
uses it to refuse a cron that never fires (``0 2 31 2 *``: 31 February): the server takes it,
and the enabled schedule never runs. ``tests/kfp/test_cron_kfp.py`` holds both against the Go
library itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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


def kfp_schedule(expr: str, start: datetime | None = None, end: datetime | None = None,
                 now: datetime | None = None) -> str:
    """:func:`to_kfp_cron`, refused when KFP's scheduler would find no fire time for it in
    the :data:`HORIZON_YEARS` from ``start`` (or now, if later), or none before ``end``."""
    kfp_cron = to_kfp_cron(expr)
    begin = max(now or datetime.now(UTC), start or datetime.min.replace(tzinfo=UTC))
    first = robfig_parse(kfp_cron).next(begin)
    limit = begin + timedelta(days=HORIZON_YEARS * 365 + 1)  # with one leap day
    when = f"after {begin:%Y-%m-%d %H:%M:%S}Z"
    if first is None or first > limit:
        raise InvalidParameter("--cron", expr, f"never fires: no time in the {HORIZON_YEARS} "
                               f"years {when} matches it (KFP would keep an enabled schedule "
                               "that never runs)")
    if end is not None and first > end:
        raise InvalidParameter("--cron", expr, f"first fires at {first:%Y-%m-%d %H:%M:%S}Z, "
                               f"after --end {end:%Y-%m-%d %H:%M:%S}Z: the schedule would never "
                               "run")
    return kfp_cron


# --- robfig/cron v1.2.0, as KFP's API server and ScheduledWorkflow controller run it ----------

HORIZON_YEARS = 4  # a leap day fires once in four years
_STAR = 1 << 63
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (min, max, names) of second, minute, hour, day of month, month, day of week.
_ROBFIG_BOUNDS = ((0, 59, None), (0, 59, None), (0, 23, None), (1, 31, None),
                  (1, 12, {n: i + 1 for i, n in enumerate(_MONTHS)}),
                  (0, 6, {n: i for i, n in enumerate(_DAYS)}))
_GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3,
                      "s": 1.0, "m": 60.0, "h": 3600.0}


class RobfigError(ValueError):
    """robfig/cron's parse error; its text is the library's, word for word."""


def _all(lo: int, hi: int) -> int:
    return _bits(lo, hi, 1) | _STAR


def _bits(lo: int, hi: int, step: int) -> int:
    return sum(1 << i for i in range(lo, hi + 1, step))


def _go_atoi(text: str) -> int:
    """Go's ``strconv.Atoi``, with robfig's wording around its error."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise RobfigError(f'Failed to parse int from {text}: strconv.Atoi: parsing "{text}": '
                          "invalid syntax")
    num = int(text)
    if num < 0:
        raise RobfigError(f"Negative number ({num}) not allowed: {text}")
    return num


def _int_or_name(text: str, names: dict | None) -> int:
    if names is not None and text.lower() in names:
        return names[text.lower()]
    return _go_atoi(text)


def _robfig_range(expr: str, lo: int, hi: int, names: dict | None) -> int:
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    extra = 0
    if low_and_high[0] in ("*", "?"):
        start, end, extra = lo, hi, _STAR
    else:
        start = _int_or_name(low_and_high[0], names)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _int_or_name(low_and_high[1], names)
        else:
            raise RobfigError(f"Too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _go_atoi(range_and_step[1])
        if len(low_and_high) == 1:  # "N/step" means "N-max/step"
            end = hi
    else:
        raise RobfigError(f"Too many slashes: {expr}")
    if start < lo:
        raise RobfigError(f"Beginning of range ({start}) below minimum ({lo}): {expr}")
    if end > hi:
        raise RobfigError(f"End of range ({end}) above maximum ({hi}): {expr}")
    if start > end:
        raise RobfigError(f"Beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise RobfigError(f"Step of range should be a positive number: {expr}")
    return _bits(start, end, step) | extra


def _go_duration(text: str) -> float:
    """Seconds of a Go ``time.ParseDuration`` string (``1h30m``); its errors' wording."""
    quoted = '"' + text + '"'
    rest = text[1:] if text[:1] in "+-" else text
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"time: invalid duration {quoted}")
    total = 0.0
    while rest:
        m = re.match(r"([0-9]*(?:\.[0-9]*)?)", rest)
        number = m.group(1)
        if number in ("", "."):
            raise ValueError(f"time: invalid duration {quoted}")
        rest = rest[len(number):]
        unit = re.match(r"[^0-9.]*", rest).group(0)
        if not unit:
            raise ValueError(f"time: missing unit in duration {quoted}")
        if unit not in _GO_DURATION_UNITS:
            raise ValueError(f'time: unknown unit "{unit}" in duration {quoted}')
        total += float(number) * _GO_DURATION_UNITS[unit]
        rest = rest[len(unit):]
    return -total if text.startswith("-") else total


@dataclass(frozen=True)
class RobfigSchedule:
    """A parsed robfig cron: one bit set per field (bit 63: the field was ``*`` or ``?``), or
    ``@every``'s whole seconds."""

    second: int = 0
    minute: int = 0
    hour: int = 0
    dom: int = 0
    month: int = 0
    dow: int = 0
    every_s: int | None = None

    def _day_matches(self, t: datetime) -> bool:
        dom_match = bool(1 << t.day & self.dom)
        dow_match = bool(1 << (t.isoweekday() % 7) & self.dow)
        if self.dom & _STAR or self.dow & _STAR:
            return dom_match and dow_match
        return dom_match or dow_match

    def next(self, after: datetime) -> datetime | None:
        """The first fire time strictly after ``after`` (UTC), or None when robfig's search
        (five years ahead) finds none."""
        t = after.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
        if self.every_s is not None:
            return t - timedelta(seconds=1) + timedelta(seconds=self.every_s)
        added = False
        year_limit = t.year + 5
        while True:  # robfig's WRAP label
            if t.year > year_limit:
                return None
            wrapped = False
            while not 1 << t.month & self.month:
                if not added:
                    added = True
                    t = t.replace(day=1, hour=0, minute=0, second=0)
                t = (t.replace(year=t.year + 1, month=1) if t.month == 12
                     else t.replace(month=t.month + 1))
                if t.month == 1:
                    wrapped = True
                    break
            if wrapped:
                continue
            for unit, start_of, first in (("day", {"hour": 0, "minute": 0, "second": 0}, 1),
                                          ("hour", {"minute": 0, "second": 0}, 0),
                                          ("minute", {"second": 0}, 0),
                                          ("second", {}, 0)):
                while not self._unit_matches(unit, t):
                    if not added:
                        added = True
                        t = t.replace(**start_of)
                    t = t + timedelta(**{unit + "s": 1})
                    if getattr(t, unit) == first:
                        wrapped = True
                        break
                if wrapped:
                    break
            if not wrapped:
                return t

    def _unit_matches(self, unit: str, t: datetime) -> bool:
        if unit == "day":
            return self._day_matches(t)
        return bool(1 << getattr(t, unit) & getattr(self, unit))


def robfig_parse(spec: str) -> RobfigSchedule:
    """robfig/cron v1.2.0's ``cron.Parse`` (seconds first, day of week optional,
    descriptors); raises :class:`RobfigError` with the library's own text."""
    if not spec:
        raise RobfigError("Empty spec string")
    if spec.startswith("@"):
        return _descriptor(spec)
    fields = spec.split()
    if not 5 <= len(fields) <= 6:
        raise RobfigError(f"Expected 5 to 6 fields, found {len(fields)}: {spec}")
    fields = [*fields, "*"][:6]
    values = []
    for text, (lo, hi, names) in zip(fields, _ROBFIG_BOUNDS, strict=True):
        bits = 0
        for expr in (part for part in text.split(",") if part):
            bits |= _robfig_range(expr, lo, hi, names)
        values.append(bits)
    return RobfigSchedule(*values)


def _descriptor(spec: str) -> RobfigSchedule:
    dow, months, dom, hours = _all(0, 6), _all(1, 12), _all(1, 31), _all(0, 23)
    fixed = {"@yearly": (1 << 1, 1 << 1), "@annually": (1 << 1, 1 << 1),
             "@monthly": (1 << 1, months)}
    if spec in fixed:
        return RobfigSchedule(1, 1, 1, fixed[spec][0], fixed[spec][1], dow)
    if spec == "@weekly":
        return RobfigSchedule(1, 1, 1, dom, months, 1)
    if spec in ("@daily", "@midnight"):
        return RobfigSchedule(1, 1, 1, dom, months, dow)
    if spec == "@hourly":
        return RobfigSchedule(1, 1, hours, dom, months, dow)
    if spec.startswith("@every "):
        try:
            seconds = _go_duration(spec[len("@every "):])
        except ValueError as err:
            raise RobfigError(f"Failed to parse duration {spec}: {err}") from None
        return RobfigSchedule(every_s=max(1, int(seconds)))
    raise RobfigError(f"Unrecognized descriptor: {spec}")
