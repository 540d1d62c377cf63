"""``draslice schedule``: recurring runs of an uploaded pipeline version.

A schedule always points at an uploaded version (``upload`` first, which is idempotent), so
the KFP UI links each scheduled run to the exact pipeline content. Schedules are found by
display name; the ones draslice makes are named ``<pipeline name>-<suffix>`` and so start
with ``draslice-``, which is how ``list`` tells ours from the rest. The intended default is
the canary variant, nightly, one schedule per claim template.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from draslice.errors import InvalidParameter
from draslice.kfp_ops.connection import KfpSession, quiet_client
from draslice.kfp_ops.cron import kfp_schedule
from draslice.kfp_ops.package import PipelinePackage, check_knobs, parse_params
from draslice.kfp_ops.paging import every, name_filter
from draslice.kfp_ops.runs import DEFAULT_EXPERIMENT, get_or_create_experiment
from draslice.kfp_ops.upload import upload

OUR_PREFIX = "draslice-"
DEFAULT_CRON = "0 2 * * *"  # nightly at 02:00 (the scheduler's time zone, UTC by default)
DEFAULT_SUFFIX = "nightly"


@dataclass(frozen=True)
class Schedule:
    """One recurring run as ``list`` shows it."""

    schedule_id: str
    name: str
    enabled: bool
    trigger: str
    max_concurrency: int
    no_catchup: bool
    pipeline_id: str | None
    version_id: str | None
    experiment_id: str | None

    def line(self) -> str:
        state = "enabled " if self.enabled else "disabled"
        return (f"{self.schedule_id}  {state}  {self.name}  [{self.trigger}]  "
                f"max-concurrency={self.max_concurrency} "
                f"catchup={'off' if self.no_catchup else 'on'}  version={self.version_id}")


@dataclass(frozen=True)
class ScheduleResult:
    schedule: Schedule
    created: bool
    note: str = ""


def utc_time(value: str | datetime | None, what: str) -> datetime | None:
    """``value`` (ISO 8601) as an aware UTC time; naive times are taken as UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        when = value
    else:
        try:
            when = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidParameter(what, value, "use ISO 8601, e.g. 2026-12-01T02:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).replace(microsecond=0)


def rfc3339(value: str | datetime | None, what: str) -> str | None:
    """``value`` as an RFC 3339 UTC timestamp; naive times are taken as UTC."""
    when = utc_time(value, what)
    return None if when is None else when.strftime("%Y-%m-%dT%H:%M:%SZ")


def checked_trigger(cron: str | None, interval_s: int | None, start=None, end=None
                    ) -> tuple[str | None, datetime | None, datetime | None]:
    """(the cron KFP is sent, or None for ``interval_s``; start; end), each refused here when
    KFP would take it and never run it: ``end`` not after ``start``, a cron with no fire time
    (``0 2 31 2 *``)."""
    if cron is not None and interval_s is not None:
        raise InvalidParameter("trigger", "--cron and --every", "choose one")
    start_t, end_t = utc_time(start, "--start"), utc_time(end, "--end")
    if start_t and end_t and end_t <= start_t:
        raise InvalidParameter("--end", end, f"must be after --start {start_t:%Y-%m-%dT%H:%M:%SZ}")
    kfp_cron = None if interval_s is not None else kfp_schedule(cron or DEFAULT_CRON, start_t,
                                                                 end_t)
    return kfp_cron, start_t, end_t


def _schedule(rr) -> Schedule:
    trig = rr.trigger
    if trig is not None and trig.cron_schedule is not None:
        trigger = f"cron {trig.cron_schedule.cron}"
    elif trig is not None and trig.periodic_schedule is not None:
        trigger = f"every {trig.periodic_schedule.interval_second}s"
    else:
        trigger = "no trigger"
    ref = rr.pipeline_version_reference
    status = str(rr.status or "").upper()
    mode = str(rr.mode or "").upper()
    enabled = status == "ENABLED" if status not in ("", "STATUS_UNSPECIFIED") else mode == "ENABLE"
    return Schedule(
        schedule_id=rr.recurring_run_id,
        name=rr.display_name,
        enabled=enabled,
        trigger=trigger,
        max_concurrency=int(rr.max_concurrency or 0),
        no_catchup=bool(rr.no_catchup),
        pipeline_id=ref.pipeline_id if ref else None,
        version_id=(ref.pipeline_version_id if ref else None) or rr.pipeline_version_id,
        experiment_id=rr.experiment_id,
    )


def list_schedules(session: KfpSession, include_all: bool = False) -> list[Schedule]:
    """Our schedules (names starting ``draslice-``), or every one with ``include_all``."""
    with session.errors("listing schedules"), quiet_client():
        rows = [_schedule(rr) for rr in every(session.client.list_recurring_runs,
                                              "recurring_runs", namespace=session.namespace)]
    return [s for s in rows if include_all or (s.name or "").startswith(OUR_PREFIX)]


def find_schedule(session: KfpSession, name_or_id: str) -> Schedule:
    """A schedule by id, or by display name when exactly one has it."""
    with session.errors("finding schedule"), quiet_client():
        by_name = [
            _schedule(rr) for rr in every(session.client.list_recurring_runs, "recurring_runs",
                                          namespace=session.namespace,
                                          filter=name_filter(name_or_id))
            if rr.display_name == name_or_id
        ]
    if len(by_name) == 1:
        return by_name[0]
    if len(by_name) > 1:
        ids = ", ".join(s.schedule_id for s in by_name)
        raise InvalidParameter("schedule", name_or_id, f"several schedules have this name "
                               f"({ids}); give the id")
    with session.errors(f"reading schedule {name_or_id}"), quiet_client():
        return _schedule(session.client.get_recurring_run(name_or_id))


def set_enabled(session: KfpSession, name_or_id: str, enabled: bool) -> Schedule:
    found = find_schedule(session, name_or_id)
    verb = "enabling" if enabled else "disabling"
    with session.errors(f"{verb} schedule {found.name}"), quiet_client():
        if enabled:
            session.client.enable_recurring_run(found.schedule_id)
        else:
            session.client.disable_recurring_run(found.schedule_id)
    return find_schedule(session, found.schedule_id)


def delete_schedule(session: KfpSession, name_or_id: str) -> Schedule:
    found = find_schedule(session, name_or_id)
    with session.errors(f"deleting schedule {found.name}"), quiet_client():
        session.client.delete_recurring_run(found.schedule_id)
    return found


def create_schedule(
    session: KfpSession,
    package: PipelinePackage,
    *,
    name: str | None = None,
    cron: str | None = None,
    interval_s: int | None = None,
    max_concurrency: int = 1,
    no_catchup: bool = True,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    enabled: bool = True,
    params: list[str] | tuple[str, ...] = (),
    experiment: str = DEFAULT_EXPERIMENT,
    service_account: str | None = None,
    replace: bool = False,
) -> ScheduleResult:
    """Upload ``package`` (idempotent) and schedule its version; an existing schedule of the
    same name is kept (or, with ``replace``, deleted and made again)."""
    kfp_cron, start_at, end_at = checked_trigger(cron, interval_s, start, end)
    start_t, end_t = rfc3339(start_at, "--start"), rfc3339(end_at, "--end")
    if max_concurrency < 1 or max_concurrency > 10:
        raise InvalidParameter("--max-concurrency", max_concurrency, "must be 1 to 10 (KFP's "
                               "limit)")
    arguments = parse_params(list(params), package.inputs)
    check_knobs(arguments, package.pipeline_name)
    suffix = DEFAULT_SUFFIX if cron is None and interval_s is None else "schedule"
    name = name or f"{package.pipeline_name}-{suffix}"
    if not name.startswith(OUR_PREFIX):
        name = OUR_PREFIX + name

    uploaded = upload(session, package)
    note = ""
    existing = [s for s in list_schedules(session) if s.name == name]
    if existing and not replace:
        old = existing[0]
        if old.version_id != uploaded.version_id:
            note = (f"it runs version {old.version_id}, not the current {uploaded.version_id}; "
                    "pass --replace to move it")
        return ScheduleResult(schedule=old, created=False, note=note)
    for old in existing:
        delete_schedule(session, old.schedule_id)
        note = f"replaced {old.schedule_id}"

    experiment_id = get_or_create_experiment(session, experiment)
    with session.errors(f"creating schedule {name}"), quiet_client():
        rr = session.client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=name,
            description=f"draslice schedule of {package.pipeline_name} ({uploaded.version_name})",
            start_time=start_t,
            end_time=end_t,
            interval_second=interval_s,
            cron_expression=kfp_cron,
            max_concurrency=max_concurrency,
            no_catchup=no_catchup,
            params=arguments,
            pipeline_id=uploaded.pipeline_id,
            version_id=uploaded.version_id,
            enabled=enabled,
            service_account=service_account,
        )
    return ScheduleResult(schedule=_schedule(rr), created=True, note=note)
