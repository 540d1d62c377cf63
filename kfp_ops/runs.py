"""``draslice submit``: one run of a pipeline, and waiting for its final state.

A run is made from a compiled package (the spec travels inline) or from an uploaded
pipeline version (the run links to it in the UI). The experiment is found by name or created
(``kfp.Client.create_experiment`` does both). Waiting is our own loop over
``kfp.Client.get_run`` because ``wait_for_run_completion`` does not count CANCELED as final
and shows no progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from draslice.errors import InvalidParameter
from draslice.kfp_ops.connection import KfpSession, quiet_client
from draslice.kfp_ops.errors import RunNotFinished
from draslice.kfp_ops.package import (
    InputParam,
    PipelinePackage,
    check_knobs,
    parse_params,
    read_inputs,
)

DEFAULT_EXPERIMENT = "draslice"

# A run's final states and the exit code each gives; every other state is "not yet".
# ERROR is not in the v2beta1 enum but older backends report it.
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "ERROR": 1, "SKIPPED": 1, "CANCELED": 5}
FINAL_STATES = frozenset(EXIT_CODES)
# What a run (or task) is while KFP 2.17 leaves its state out: until the persistence agent has
# read a phase from the Workflow, GET run has no ``state`` (its ``state_history`` gets an entry
# with an update time and no state).
NO_STATE = "PENDING (the server reports no state yet)"


@dataclass(frozen=True)
class SubmittedRun:
    run_id: str
    run_name: str
    experiment_id: str
    experiment_name: str
    url: str


@dataclass
class RunOutcome:
    run_id: str
    state: str
    url: str
    error: str = ""
    tasks: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.state, 1)

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"


def default_run_name(pipeline_name: str) -> str:
    """``<pipeline name> <UTC time>``, as ``submit --help`` says, whichever way the run is
    made."""
    return f"{pipeline_name} {datetime.now(UTC):%Y-%m-%d %H:%M:%S}Z"


def version_inputs(session: KfpSession, pipeline_id: str,
                   version_id: str) -> tuple[dict[str, InputParam], str]:
    """Root inputs and pipeline name of an uploaded version, from the spec the server
    stored; refused when the version belongs to another pipeline.

    KFP 2.17 answers GET ``pipelines/<any id>/versions/<version id>`` whatever the pipeline
    id, and refuses the run only then, with an internal error (HTTP 500)."""
    with session.errors(f"reading pipeline version {version_id}"), quiet_client():
        version = session.client.get_pipeline_version(pipeline_id, version_id)
    if version.pipeline_id and version.pipeline_id != pipeline_id:
        raise InvalidParameter("--version-id", version_id,
                               f"belongs to pipeline {version.pipeline_id}, not to --pipeline-id "
                               f"{pipeline_id}; give --pipeline-id {version.pipeline_id}")
    spec = version.pipeline_spec or {}
    if "pipeline_spec" in spec:  # stored as {pipeline_spec, platform_spec}
        spec = spec["pipeline_spec"]
    name = str((spec.get("pipelineInfo") or {}).get("name", ""))
    # a server may store the name as its metadata context ("[namespace/NS/]pipeline/NAME")
    return read_inputs(spec), name.rpartition("/")[2]


def get_or_create_experiment(session: KfpSession, name: str) -> str:
    with session.errors(f"finding or creating experiment {name!r}"), quiet_client():
        experiment = session.client.create_experiment(name=name, namespace=session.namespace)
    return experiment.experiment_id


def submit(
    session: KfpSession,
    package: PipelinePackage | None = None,
    *,
    pipeline_id: str | None = None,
    version_id: str | None = None,
    params: list[str] | tuple[str, ...] | dict = (),
    experiment: str = DEFAULT_EXPERIMENT,
    run_name: str | None = None,
    service_account: str | None = None,
    enable_caching: bool | None = None,
) -> SubmittedRun:
    """Start a run from ``package``, or from an uploaded ``pipeline_id`` + ``version_id``.

    ``params`` are ``key=value`` strings (typed against the pipeline's inputs) or a dict of
    already typed values (still checked against the input names).
    """
    if (package is None) == (version_id is None) or (version_id is None) != (pipeline_id is None):
        raise InvalidParameter(
            "pipeline", None, "give either a compiled package or both pipeline_id and version_id"
        )
    if package:
        inputs, name = package.inputs, package.pipeline_name
    else:
        inputs, name = version_inputs(session, pipeline_id, version_id)
    if isinstance(params, dict):
        unknown = sorted(set(params) - set(inputs))
        if unknown:
            raise InvalidParameter("params", unknown, "valid: " + ", ".join(inputs))
        arguments = dict(params)
    else:
        arguments = parse_params(list(params), inputs)
    check_knobs(arguments, name)
    label = package.pipeline_name if package else f"version {version_id}"
    run_name = run_name or default_run_name(name or label)
    experiment_id = get_or_create_experiment(session, experiment)
    with session.errors(f"creating a run of {label}"), quiet_client():
        run = session.client.run_pipeline(
            experiment_id=experiment_id,
            job_name=run_name,
            pipeline_package_path=str(package.path) if package else None,
            pipeline_id=pipeline_id,
            version_id=version_id,
            params=arguments,
            enable_caching=enable_caching,
            service_account=service_account,
        )
    return SubmittedRun(
        run_id=run.run_id, run_name=run_name, experiment_id=experiment_id,
        experiment_name=experiment, url=session.ui_link(f"runs/details/{run.run_id}"),
    )


def _state(value) -> str:
    state = str(value or "").upper()
    return NO_STATE if state in ("", "RUNTIME_STATE_UNSPECIFIED") else state


def _task_states(run) -> dict[str, str]:
    details = getattr(run, "run_details", None)
    tasks = getattr(details, "task_details", None) or []
    return {(t.display_name or t.task_id or "?"): _state(t.state) for t in tasks}


def wait(
    session: KfpSession,
    run_id: str,
    timeout_s: float = 3600,
    poll_s: float = 5,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RunOutcome:
    """Poll the run until a final state (CANCELED included); report each change.

    Raises :class:`RunNotFinished` after ``timeout_s``; the run keeps going on the server.
    """
    start = clock()
    last_state, last_tasks = None, {}
    url = session.ui_link(f"runs/details/{run_id}")
    while True:
        with session.errors(f"reading run {run_id}"), quiet_client():
            run = session.client.get_run(run_id)
        state = _state(run.state)
        tasks = _task_states(run)
        elapsed = clock() - start
        if progress is not None:
            if state != last_state:
                progress(f"[{elapsed:6.0f}s] run {state}")
            for name, task_state in sorted(tasks.items()):
                if last_tasks.get(name) != task_state:
                    progress(f"[{elapsed:6.0f}s]   task {name}: {task_state}")
        last_state, last_tasks = state, tasks
        if state in FINAL_STATES:
            err = getattr(run, "error", None)
            message = (getattr(err, "message", None) or "") if err else ""
            return RunOutcome(run_id=run_id, state=state, url=url, error=message, tasks=tasks)
        if elapsed >= timeout_s:
            raise RunNotFinished(
                f"run {run_id} is still {state} after {timeout_s:.0f}s; it goes on on the "
                f"server: {url}"
            )
        sleep(poll_s)
