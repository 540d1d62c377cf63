"""Upload, submit and schedule draslice pipelines on a KFP server, on top of ``kfp.Client``.

The same functions back ``draslice upload``, ``draslice submit`` and ``draslice schedule``,
for notebooks and CI scripts::

    from draslice.kfp_ops import KfpConnection, connect, resolve_package, upload, submit, wait

    session = connect(KfpConnection(host="http://127.0.0.1:8080", token_env="KFP_TOKEN"))
    package = resolve_package("sft.policy.mig-1g-6gb")
    print(upload(session, package).url)
    run = submit(session, package, params=["steps=60"], experiment="draslice")
    outcome = wait(session, run.run_id, progress=print)
    assert outcome.succeeded, outcome.state
"""

from draslice.kfp_ops.connection import KfpConnection, KfpSession, connect
from draslice.kfp_ops.cron import parse_interval, to_kfp_cron
from draslice.kfp_ops.errors import (
    KfpAuthError,
    KfpError,
    KfpNotFound,
    KfpUnreachable,
    NativeClaimsRejected,
    RunNotFinished,
)
from draslice.kfp_ops.package import PipelinePackage, parse_params, resolve_package, variant_ids
from draslice.kfp_ops.runs import RunOutcome, SubmittedRun, submit, wait
from draslice.kfp_ops.schedule import (
    Schedule,
    create_schedule,
    delete_schedule,
    list_schedules,
    set_enabled,
)
from draslice.kfp_ops.upload import UploadResult, upload

__all__ = [
    "KfpAuthError", "KfpConnection", "KfpError", "KfpNotFound", "KfpSession", "KfpUnreachable",
    "NativeClaimsRejected", "PipelinePackage", "RunNotFinished", "RunOutcome", "Schedule",
    "SubmittedRun", "UploadResult", "connect", "create_schedule", "delete_schedule",
    "list_schedules", "parse_interval", "parse_params", "resolve_package", "set_enabled",
    "submit", "to_kfp_cron", "upload", "variant_ids", "wait",
]
