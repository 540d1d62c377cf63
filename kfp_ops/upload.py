"""``draslice upload``: put a compiled pipeline on the server, once per distinct content.

The pipeline is found by name (``pipelineInfo.name``, e.g. ``draslice-sft-mig-1g-6gb``) and
created when missing; the version is found by its content-derived name
(:attr:`PipelinePackage.version_name`) and uploaded only when missing. Re-running with the
same YAML therefore creates nothing, and a changed YAML adds exactly one version.

A new pipeline starts with the server's own first version (named after the pipeline, which
the upload call cannot rename); draslice then adds its content-named version beside it, so
that every later run can find "this exact content" by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from draslice.errors import InvalidParameter
from draslice.kfp_ops.connection import KfpSession, quiet_client
from draslice.kfp_ops.package import PipelinePackage
from draslice.kfp_ops.paging import every, name_filter


@dataclass(frozen=True)
class UploadResult:
    pipeline_name: str
    pipeline_id: str
    version_name: str
    version_id: str
    created_pipeline: bool
    created_version: bool
    url: str

    def lines(self) -> list[str]:
        p = "created" if self.created_pipeline else "exists"
        v = "created" if self.created_version else "unchanged, nothing uploaded"
        return [
            f"pipeline  {self.pipeline_name}  id={self.pipeline_id}  ({p})",
            f"version   {self.version_name}  id={self.version_id}  ({v})",
            f"UI        {self.url}",
        ]


def find_pipeline_id(session: KfpSession, name: str, namespace: str | None = None) -> str | None:
    found = [
        p for p in every(session.client.list_pipelines, "pipelines",
                         filter=name_filter(name), namespace=namespace)
        if p.display_name == name
    ]
    if len(found) > 1:
        raise InvalidParameter(
            "pipeline name", name,
            f"{len(found)} pipelines on the server have this name; delete the extra ones or "
            "pass --name to use another",
        )
    return found[0].pipeline_id if found else None


def find_version_id(session: KfpSession, pipeline_id: str, version_name: str) -> str | None:
    for v in every(session.client.list_pipeline_versions, "pipeline_versions",
                   pipeline_id=pipeline_id, filter=name_filter(version_name)):
        if version_name in (v.display_name, getattr(v, "name", None)):
            return v.pipeline_version_id
    return None


def upload(
    session: KfpSession,
    package: PipelinePackage,
    name: str | None = None,
    description: str | None = None,
) -> UploadResult:
    """Create the pipeline if missing, add the content-named version if missing."""
    name = name or package.pipeline_name
    description = description if description is not None else package.description
    version_name = package.version_name
    client = session.client
    with session.errors(f"uploading {name}"), quiet_client():
        pipeline_id = find_pipeline_id(session, name, session.namespace)
        created_pipeline = pipeline_id is None
        if created_pipeline:
            pipeline = client.upload_pipeline(
                str(package.path), pipeline_name=name, description=description,
                namespace=session.namespace,
            )
            pipeline_id = pipeline.pipeline_id
            version_id = None
        else:
            version_id = find_version_id(session, pipeline_id, version_name)
        created_version = version_id is None
        if created_version:
            version = client.upload_pipeline_version(
                str(package.path), pipeline_version_name=version_name,
                pipeline_id=pipeline_id, description=description or None,
            )
            version_id = version.pipeline_version_id
    return UploadResult(
        pipeline_name=name,
        pipeline_id=pipeline_id,
        version_name=version_name,
        version_id=version_id,
        created_pipeline=created_pipeline,
        created_version=created_version,
        url=session.ui_link(f"pipelines/details/{pipeline_id}/version/{version_id}"),
    )
