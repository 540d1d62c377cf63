"""``draslice compile``: the pipeline YAML users upload to the KFP UI."""

from __future__ import annotations

from pathlib import Path

import click

from draslice.errors import InvalidParameter
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.variants import KINDS, VARIANTS, Variant, compile_all, compile_variant

COMMITTED_DIR = "compiled"


@click.command("compile")
@click.option("--out", "out_dir", default=COMMITTED_DIR, show_default=True,
              type=click.Path(file_okay=False), help="Folder to write the YAML into.")
@click.option("--template", default=None,
              help="Compile one pipeline for this claim template instead of the committed set.")
@click.option("--mode", type=click.Choice([m.value for m in ClaimMode]), default="policy",
              show_default=True,
              help="With --template: policy (pod label + admission policy, any KFP 2.x) or "
                   "native (podResourceClaims, KFP backends with kubeflow/pipelines#14243).")
@click.option("--kind", type=click.Choice(KINDS), default="sft", show_default=True,
              help="With --template: the synthetic SFT pipeline, the preflight+smoke canary, "
                   "finetune (your model and data from a PVC), or finetune-artifact (the model "
                   "imported as a Model artifact from a URI: s3://, gs://, minio://, oci://; the "
                   "data from the PVC).")
@click.option("--pvc", "pvc_name", default="draslice-data", show_default=True,
              help="With a finetune kind: the PersistentVolumeClaim holding data, checkpoints "
                   "(and, for finetune, the model).")
@click.option("--mount-path", default="/data", show_default=True,
              help="With a finetune kind: where that PVC is mounted in the tasks.")
@click.option("--image", default=None, metavar="REF",
              help="The trainer image the tasks run on: your registry's copy of "
                   "trainer/Dockerfile, e.g. registry.example.com/team/draslice-trainer:0.1.0. "
                   "[default: $DRASLICE_TRAINER_IMAGE, else ghcr.io/draslice/trainer:<version>] "
                   "Needs --out other than compiled/ (the committed files keep the default).")
@click.option("--kueue-queue", default=None, metavar="NAME",
              help="Label the GPU tasks' pods kueue.x-k8s.io/queue-name=NAME so Kueue admits "
                   "them against that LocalQueue's quota on slices. Needs --out other than "
                   "compiled/ (the committed files stay without it).")
def compile_pipelines(
    out_dir: str, template: str | None, mode: str, kind: str, pvc_name: str, mount_path: str,
    image: str | None, kueue_queue: str | None,
) -> None:
    """Compile the pipelines to KFP YAML (byte-for-byte reproducible).

    Without --template it regenerates every file committed under compiled/: the SFT and the
    finetune pipelines (model from the PVC, or imported as a Model artifact) for the
    mig-1g-6gb and shared-gpu-timeslice templates in policy and native mode (both finetune
    kinds mount PVC draslice-data at /data), and the canary per template.
    The template name is checked (DNS-1123, at most 63 characters).

    \b
    Examples:
      draslice compile                                   # refresh compiled/
      draslice compile --template mig-2g-12gb --out my/  # your own template
      draslice compile --template mig-1g-6gb --mode native --kind canary
      draslice compile --template mig-2g-12gb --kind finetune --pvc team-llm --out my/
      draslice compile --template mig-2g-12gb --kind finetune-artifact --out my/
      draslice compile --kueue-queue gpu-slices --out compiled-kueue/
      draslice compile --image registry.example.com/team/draslice-trainer:0.1.0 --out my/
    """
    from draslice.components.image import DEFAULT_TRAINER_IMAGE, trainer_image
    from draslice.trainer.outputs import check_writable_dir

    image = trainer_image(image)
    into_committed = Path(out_dir).resolve() == Path(COMMITTED_DIR).resolve()
    if image != DEFAULT_TRAINER_IMAGE and into_committed:
        raise InvalidParameter(
            "out", out_dir,
            f"the trainer image {image} goes into another folder: choose one with --out "
            f"(compiled/ holds the committed pipelines, on {DEFAULT_TRAINER_IMAGE})",
        )
    if kueue_queue is not None:
        from draslice.cluster.manifests.kueue import check_queue_name

        check_queue_name(kueue_queue)
        if into_committed:
            raise InvalidParameter(
                "out", out_dir,
                "--kueue-queue writes the same file names: choose another folder with --out "
                "(compiled/ holds the committed pipelines, without a queue)",
            )
    variant = None if template is None else Variant(
        kind, template, ClaimMode.parse(mode), pvc_name=pvc_name, mount_path=mount_path,
        kueue_queue=kueue_queue)  # names checked here, before any file is written
    check_writable_dir(out_dir, "out", created=[])
    if variant is None:
        paths = compile_all(out_dir, kueue_queue, image)
        click.echo(f"compiled {len(paths)} of {len(VARIANTS)} pipelines into {Path(out_dir)}/")
        for p in paths:
            click.echo(f"  {p}")
        return
    path = compile_variant(variant, out_dir, image)
    click.echo(str(path))
