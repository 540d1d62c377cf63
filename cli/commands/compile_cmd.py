"""``draslice compile``: the pipeline YAML users upload to the KFP UI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from draslice.errors import InvalidParameter
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.variants import (
    KINDS,
    TRAINJOB_KINDS,
    VARIANTS,
    VOLUME_KINDS,
    Variant,
    compile_variant,
    select,
)

COMMITTED_DIR = "compiled"


@click.command("compile")
@click.option("--out", "out_dir", default=COMMITTED_DIR, show_default=True,
              type=click.Path(file_okay=False), help="Folder to write the YAML into.")
@click.option("--template", default=None,
              help="Compile for this claim template instead of the committed set's two.")
@click.option("--mode", type=click.Choice([m.value for m in ClaimMode]), default="policy",
              show_default="policy; without --template: both",
              help="policy (pod label + admission policy, any KFP 2.x) or native "
                   "(podResourceClaims, KFP backends with kubeflow/pipelines#14243). Without "
                   "--template: only the committed files of that mode.")
@click.option("--kind", type=click.Choice(KINDS), default="sft",
              show_default="sft; without --template: every kind",
              help="The synthetic SFT pipeline, the preflight+smoke canary, finetune (your "
                   "model and data from a PVC), finetune-artifact (the model imported as a Model "
                   "artifact from a URI: s3://, gs://, minio://, oci://; the data from the PVC), "
                   "sweep or finetune-trainjob. Without --template: only the committed files of "
                   "that kind.")
@click.option("--pvc", "pvc_name", default="draslice-data", show_default=True,
              help="With the kinds that mount a volume (finetune, finetune-artifact, sweep, "
                   "finetune-trainjob): the PersistentVolumeClaim holding data, checkpoints "
                   "(and, for finetune, the model). Another one needs --out other than "
                   "compiled/.")
@click.option("--mount-path", default="/data", show_default=True,
              help="With those kinds: where that PVC is mounted in the tasks. Another one "
                   "needs --out other than compiled/.")
@click.option("--image", default=None, metavar="REF",
              help="The trainer image the tasks run on: your registry's copy of "
                   "trainer/Dockerfile, e.g. registry.example.com/team/draslice-trainer:0.1.0. "
                   "[default: $DRASLICE_TRAINER_IMAGE, else ghcr.io/draslice/trainer:<version>] "
                   "Needs --out other than compiled/ (the committed files keep the default).")
@click.option("--kueue-queue", default=None, metavar="NAME",
              help="Label the GPU tasks' pods kueue.x-k8s.io/queue-name=NAME so Kueue admits "
                   "them against that LocalQueue's quota on slices. Needs --out other than "
                   "compiled/ (the committed files stay without it).")
@click.pass_context
def compile_pipelines(
    ctx: click.Context, out_dir: str, template: str | None, mode: str, kind: str,
    pvc_name: str, mount_path: str, image: str | None, kueue_queue: str | None,
) -> None:
    """Compile the pipelines to KFP YAML (byte-for-byte reproducible).

    Without --template it regenerates the files committed under compiled/: the SFT, finetune
    (model from the PVC), finetune-artifact (model imported as a Model artifact) and sweep
    pipelines for the mig-1g-6gb and shared-gpu-timeslice templates in policy and native mode
    (the finetune kinds mount PVC draslice-data at /data), the canary per template and the
    TrainJob variant; --mode and --kind narrow that set to the files of that mode or kind.
    With --template it compiles the one pipeline of --kind and --mode for that template.
    The template name is checked (DNS-1123, at most 63 characters).

    \b
    Examples:
      draslice compile                                   # refresh compiled/
      draslice compile --mode native                     # its native-mode files only
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
    given = {name for name in ("mode", "kind", "pvc_name", "mount_path")
             if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}
    claim_mode = ClaimMode.parse(mode)
    if kind in TRAINJOB_KINDS and "mode" in given:
        raise InvalidParameter(
            "mode", mode, f"{kind} has no claim mode (its pods get their claims from the "
            "TrainingRuntime): leave --mode out")
    # The committed set when no template is named, narrowed to what --kind and --mode name.
    chosen = (Variant(kind, template, claim_mode),) if template is not None else select(
        kind if "kind" in given else None, claim_mode if "mode" in given else None)
    if not chosen:
        raise InvalidParameter(
            "mode", mode, f"compiled/ holds no {mode}-mode {kind} pipeline (it holds "
            f"{', '.join(v.filename for v in select(kind))}): add --template T to compile one")
    volume = {name: value for name, value in (("pvc_name", pvc_name), ("mount_path", mount_path))
              if name in given}
    if volume:
        if not any(v.kind in VOLUME_KINDS for v in chosen):
            raise InvalidParameter(
                "kind", kind, f"--pvc and --mount-path apply to the kinds that mount a volume "
                f"({', '.join(VOLUME_KINDS)}): --kind {kind} mounts none")
        defaults = {p.name: p.default for p in ctx.command.params}
        if into_committed and any(value != defaults[name] for name, value in volume.items()):
            raise InvalidParameter(
                "out", out_dir, "another --pvc or --mount-path writes the same file names: "
                "choose another folder with --out (compiled/ mounts the committed default)")
    # Names are checked here, as each variant is made, before any file is written.
    chosen = tuple(replace(v, kueue_queue=kueue_queue,
                           **(volume if v.kind in VOLUME_KINDS else {})) for v in chosen)
    check_writable_dir(out_dir, "out", created=[])
    paths = [compile_variant(v, out_dir, image) for v in chosen]
    if template is not None:
        click.echo(str(paths[0]))
        return
    click.echo(f"compiled {len(paths)} of {len(VARIANTS)} pipelines into {Path(out_dir)}/")
    for p in paths:
        click.echo(f"  {p}")
