"""A compiled pipeline as draslice uploads and runs it: which file, which name, which version.

``--variant`` names one of :data:`draslice.pipelines.variants.VARIANTS` by its file stem
(``sft.policy.mig-1g-6gb``) or gives a path to any compiled KFP YAML. The version name is
derived from the content (package version plus a short SHA-256 of the YAML bytes), so
uploading an unchanged pipeline twice finds the version it made the first time.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from draslice import __version__
from draslice.cluster.names import NATIVE_FIELD
from draslice.errors import InvalidParameter
from draslice.kfp_ops.errors import shorten

DEFAULT_COMPILED_DIR = "compiled"
DIGEST_CHARS = 12


@dataclass(frozen=True)
class InputParam:
    """One root input of a pipeline, as its compiled ``inputDefinitions`` declare it."""

    name: str
    type: str  # STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST, STRUCT
    default: Any = None
    optional: bool = False


@dataclass(frozen=True)
class PipelinePackage:
    path: Path
    pipeline_name: str
    description: str
    digest: str
    inputs: dict[str, InputParam] = field(default_factory=dict)
    native_claims: bool = False
    variant_id: str | None = None
    images: tuple[str, ...] = ()  # the container images its tasks run on

    @property
    def version_name(self) -> str:
        """Same content, same name: ``v<draslice version>-<12 hex of the YAML's SHA-256>``."""
        return f"v{__version__}-{self.digest[:DIGEST_CHARS]}"


def variant_ids() -> list[str]:
    from draslice.pipelines.variants import VARIANTS

    return [v.filename.removesuffix(".yaml") for v in VARIANTS]


def _variant(variant_id: str):
    from draslice.pipelines.variants import VARIANTS

    for v in VARIANTS:
        if v.filename.removesuffix(".yaml") == variant_id:
            return v
    return None


def _documents(path: Path) -> tuple[dict, dict]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidParameter(
            "--variant", str(path), f"not a text file (byte {err.start} is "
            f"{data[err.start]:#04x}, not UTF-8); give a compiled pipeline YAML "
            "(`draslice compile`)") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or "cannot be parsed"
        raise InvalidParameter("--variant", str(path),
                               f"not valid YAML ({where}{problem})") from None
    if not docs or not isinstance(docs[0], dict) or "pipelineInfo" not in docs[0]:
        raise InvalidParameter(
            "--variant", str(path), "not a compiled KFP pipeline (no pipelineInfo in the first "
            "document); compile one with `draslice compile`"
        )
    platform = docs[1] if len(docs) > 1 and isinstance(docs[1], dict) else {}
    return docs[0], platform


def read_inputs(spec: dict) -> dict[str, InputParam]:
    """Root input parameters of a pipeline spec dict (camelCase, as compiled or as served)."""
    root = spec.get("root", {})
    defs = root.get("inputDefinitions", root.get("input_definitions", {})) or {}
    params = defs.get("parameters", {}) or {}
    out = {}
    for name, p in params.items():
        out[name] = InputParam(
            name=name,
            type=p.get("parameterType", p.get("parameter_type", "STRING")),
            default=p.get("defaultValue", p.get("default_value")),
            optional=bool(p.get("isOptional", p.get("is_optional", False))),
        )
    return out


def container_images(spec: dict) -> tuple[str, ...]:
    """The images of a compiled pipeline's container executors, sorted, each once."""
    executors = (spec.get("deploymentSpec") or {}).get("executors") or {}
    return tuple(sorted({str(e["container"]["image"]) for e in executors.values()
                         if isinstance(e, dict) and isinstance(e.get("container"), dict)
                         and e["container"].get("image")}))


def default_image_warning(packages: list[PipelinePackage]) -> str | None:
    """One line when a pipeline about to be sent still runs on the default trainer image,
    which nobody has pushed (its pods would end in ImagePullBackOff); None otherwise."""
    from draslice.components.image import DEFAULT_TRAINER_IMAGE

    named = [p.pipeline_name for p in packages if DEFAULT_TRAINER_IMAGE in p.images]
    if not named:
        return None
    which = f"{named[0]} runs" if len(named) == 1 else f"{len(named)} pipelines run"
    return (f"warning: {which} on the default image {DEFAULT_TRAINER_IMAGE}, which is "
            "not pushed to any registry: build and push trainer/Dockerfile, then "
            "`draslice compile --image YOUR/IMAGE:TAG --out DIR` and send a file from DIR")


def check_spec(text: str, spec: dict, path: Path) -> None:
    """Refuse a pipeline spec KFP's SDK cannot load (``kfp.components.load_component_from_text``
    parses it into the released ``PipelineSpec``), or one that names a component, executor or
    task it does not define: KFP takes such a file and the run fails later, on the cluster."""
    from google.protobuf.json_format import ParseError
    from kfp.components import load_component_from_text

    try:
        load_component_from_text(text)
    except (ParseError, KeyError, TypeError, ValueError) as err:
        reason = f"no {err.args[0]!r} section" if isinstance(err, KeyError) else err
        raise InvalidParameter("--variant", str(path), shorten(
            f"KFP's SDK cannot load it as a pipeline: {reason}", 300)) from None
    components = spec.get("components") or {}
    executors = ((spec.get("deploymentSpec") or {}).get("executors")) or {}
    dags = {"root": spec.get("root") or {}, **components}
    for dag_name, component in dags.items():
        tasks = ((component.get("dag") or {}).get("tasks")) or {}
        for task_name, task in tasks.items():
            ref = ((task.get("componentRef") or {}).get("name")) or ""
            if ref not in components:
                raise InvalidParameter(
                    "--variant", str(path),
                    f"task {task_name!r} of {dag_name} uses component {ref!r}, which the file "
                    f"does not define (it defines {', '.join(sorted(components)) or 'none'})")
            for dep in task.get("dependentTasks") or ():
                if dep not in tasks:
                    raise InvalidParameter(
                        "--variant", str(path),
                        f"task {task_name!r} of {dag_name} depends on task {dep!r}, which "
                        f"{dag_name} does not have")
    for name, component in components.items():
        label = component.get("executorLabel")
        if label is not None and label not in executors:
            raise InvalidParameter(
                "--variant", str(path),
                f"component {name!r} runs executor {label!r}, which the file does not define "
                f"(it defines {', '.join(sorted(executors)) or 'none'})")


def has_native_claims(platform: dict) -> bool:
    executors = (platform.get("platforms", {}).get("kubernetes", {})
                 .get("deploymentSpec", {}).get("executors", {}))
    return any(NATIVE_FIELD in (cfg or {}) for cfg in executors.values())


def load_package(path: str | Path, variant_id: str | None = None) -> PipelinePackage:
    path = Path(path)
    if not path.is_file():
        raise InvalidParameter("--variant", str(path), "no such file")
    spec, platform = _documents(path)
    check_spec(path.read_text(), spec, path)
    info = spec["pipelineInfo"]
    return PipelinePackage(
        path=path,
        pipeline_name=info.get("name", path.stem),
        description=info.get("description", ""),
        digest=hashlib.sha256(path.read_bytes()).hexdigest(),
        inputs=read_inputs(spec),
        native_claims=has_native_claims(platform),
        variant_id=variant_id,
        images=container_images(spec),
    )


def resolve_package(
    variant: str, compiled_dir: str | Path = DEFAULT_COMPILED_DIR
) -> PipelinePackage:
    """The package for a variant id or a YAML path.

    A variant id reads ``<compiled_dir>/<id>.yaml`` when it is there (the committed,
    reviewed file); otherwise it compiles the variant into a temporary folder, which gives the
    same bytes because compiling is deterministic.
    """
    candidate = Path(variant)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        return load_package(candidate)
    v = _variant(variant)
    if v is None:
        raise InvalidParameter(
            "--variant", variant,
            "not a compiled variant or a .yaml path; variants: " + ", ".join(variant_ids()),
        )
    committed = Path(compiled_dir) / v.filename
    if committed.is_file():
        return load_package(committed, variant_id=variant)
    from draslice.pipelines.variants import compile_variant

    out = Path(tempfile.mkdtemp(prefix="draslice-compiled-"))
    return load_package(compile_variant(v, out), variant_id=variant)


_TYPE_NAMES = {"STRING": "str", "NUMBER_INTEGER": "int", "NUMBER_DOUBLE": "float",
               "BOOLEAN": "bool", "LIST": "list", "STRUCT": "dict"}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _convert(param: InputParam, raw: str) -> Any:
    kind = param.type
    try:
        if kind == "NUMBER_INTEGER":
            return int(raw)
        if kind == "NUMBER_DOUBLE":
            return float(raw)
        if kind == "BOOLEAN":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if kind in ("LIST", "STRUCT"):
            value = json.loads(raw)
            want = list if kind == "LIST" else dict
            if not isinstance(value, want):
                raise ValueError(raw)
            return value
    except ValueError:
        expected = {
            "NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number",
            "BOOLEAN": "true or false", "LIST": "a JSON list", "STRUCT": "a JSON object",
        }[kind]
        raise InvalidParameter(f"--param {param.name}", raw, f"must be {expected}") from None
    return raw


def parse_params(pairs: list[str] | tuple[str, ...], inputs: dict[str, InputParam]) -> dict:
    """``key=value`` strings typed against the pipeline's inputs; unknown keys rejected."""
    out: dict[str, Any] = {}
    valid = ", ".join(
        f"{p.name} ({_TYPE_NAMES.get(p.type, p.type.lower())})" for p in inputs.values()
    ) or "none"
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidParameter("--param", pair, "must look like key=value")
        if key not in inputs:
            raise InvalidParameter(
                "--param", key, f"this pipeline has no such input; valid: {valid}"
            )
        out[key] = _convert(inputs[key], raw)
    return out


def arguments_for(package: PipelinePackage, pairs: list[str] | tuple[str, ...]) -> dict:
    """``key=value`` strings as the typed, range-checked arguments of ``package``'s inputs."""
    arguments = parse_params(pairs, package.inputs)
    check_knobs(arguments, package.pipeline_name)
    return arguments


def check_knobs(arguments: dict[str, Any], pipeline_name: str) -> None:
    """Check fine-tune knobs among ``arguments`` against their declared ranges and choices,
    with the pipeline's preset for the knobs not given (the rules that tie knobs together),
    and the pipeline's own parameters that take one of a few words (``on_missing_dra``), so
    that a run that would fail in its first task is refused before anything is sent."""
    from draslice.pipelines.variants import PARAMETER_CHOICES, preset_of
    from draslice.trainer.config import check_params

    for name, choices in PARAMETER_CHOICES.items():
        if name in arguments and arguments[name] not in choices:
            raise InvalidParameter(f"--param {name}", arguments[name],
                                   "must be one of " + ", ".join(choices))
    preset = preset_of(pipeline_name)
    try:
        check_params(arguments, base=None if preset is None else preset.values)
    except InvalidParameter as err:
        if err.name in arguments:
            raise InvalidParameter(f"--param {err.name}", err.value, err.valid) from None
        raise InvalidParameter(
            f"--param {err.name}", err.value,
            f"{err.valid} (the pipeline's default; set it too with --param {err.name}=VALUE)",
        ) from None
