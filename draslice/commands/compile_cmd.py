"""``draslice compile``: the pipeline YAML users upload to the KFP UI."""

from __future__ import annotations

from pathlib import Path

import click

from draslice.pipelines.claim import ClaimMode


@click.command("compile")
@click.option("--out", "out_dir", default="compiled", show_default=True,
              type=click.Path(file_okay=False), help="Folder to write the YAML into.")
@click.option("--template", default=None,
              help="Compile one pipeline for this claim template instead of the committed set.")
@click.option("--mode", type=click.Choice([m.value for m in ClaimMode]), default="policy",
              show_default=True,
              help="With --template: policy (pod label + admission policy, any KFP 2.x) or "
                   "native (podResourceClaims, KFP backends with kubeflow/pipelines#14243).")
@click.option("--kind", type=click.Choice(["sft", "canary", "finetune"]), default="sft",
              show_default=True,
              help="With --template: the synthetic SFT pipeline, the preflight+smoke canary, or "
                   "finetune (your model and data from a PVC).")
@click.option("--pvc", "pvc_name", default="draslice-data", show_default=True,
              help="With --kind finetune: the PersistentVolumeClaim holding models and data.")
@click.option("--mount-path", default="/data", show_default=True,
              help="With --kind finetune: where that PVC is mounted in the tasks.")
def compile_pipelines(out_dir: str, template: str | None, mode: str, kind: str, pvc_name: str,
                      mount_path: str) -> None:
    """Compile the pipelines to KFP YAML (byte-for-byte reproducible).

    Without --template it regenerates every file committed under compiled/: the SFT and the
    finetune pipelines for the mig-1g-6gb and shared-gpu-timeslice templates in policy and
    native mode (finetune mounts PVC draslice-data at /data), and the canary per template.
    The template name is checked (DNS-1123, at most 63 characters).

    \b
    Examples:
      draslice compile                                   # refresh compiled/
      draslice compile --template mig-2g-12gb --out my/  # your own template
      draslice compile --template mig-1g-6gb --mode native --kind canary
      draslice compile --template mig-2g-12gb --kind finetune --pvc team-llm --out my/
    """
    from draslice.pipelines.variants import VARIANTS, Variant, compile_all, compile_variant

    if template is None:
        paths = compile_all(out_dir)
        click.echo(f"compiled {len(paths)} of {len(VARIANTS)} pipelines into {Path(out_dir)}/")
        for p in paths:
            click.echo(f"  {p}")
        return
    path = compile_variant(
        Variant(kind, template, ClaimMode.parse(mode), pvc_name, mount_path), out_dir
    )
    click.echo(str(path))
