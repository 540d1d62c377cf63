"""A sweep's runs: a list of fine-tune knob values, each checked and completed from a preset.

One place decides what a sweep runs, for ``draslice run --sweep`` (before kfp.local starts) and
for the sweep pipeline's first task (before any GPU task starts on a cluster, where the list is
a run parameter typed into the KFP UI):

- each entry is a mapping of knob names (``trainer/config.py``) to values, plus an optional
  ``name``; every value is checked with :func:`~draslice.trainer.config.check_params` against
  the preset the sweep starts from, so a bad rate or rank stops the sweep before any work;
- each run is completed with the preset's value for every knob it leaves out: every loop
  iteration passes every knob to the fine-tune (``item.<knob>``), so each item must hold them
  all;
- names are unique (``run-<i>`` when none is given), as are the runs themselves: two equal
  runs would only spend a slice to learn nothing;
- with a ``checkpoint_dir``, each run checkpoints under ``<checkpoint_dir>/<name>``: runs of
  one sweep share a pipeline run id, and must not resume from each other's checkpoints.

torch- and kfp-free, so the CLI refuses a bad file at once.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draslice.errors import DrasliceError, InvalidParameter
from draslice.trainer.config import KNOBS, check_params
from draslice.trainer.presets import PRESETS

NAME = "name"
NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?")


class SweepFileError(DrasliceError):
    """The sweep file cannot be read as a list of runs; the message names the file."""


def load_runs(path: str | Path) -> list[dict]:
    """The runs of a sweep file: a YAML or JSON list of mappings (JSON is YAML too)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise SweepFileError(f"{path}: cannot read the sweep file ({err.strerror})") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise SweepFileError(f"{path}{where}: not valid YAML or JSON "
                             f"({getattr(err, 'problem', None) or err})") from err
    if not isinstance(data, list) or not data:
        raise SweepFileError(
            f"{path}: expected a non-empty list of runs, each a mapping of knob values "
            f"(e.g. '- {{learning_rate: 0.001, lora_r: 8}}'), got {type(data).__name__}")
    for i, run in enumerate(data):
        if not isinstance(run, dict):
            raise SweepFileError(f"{path}: run {i} is a {type(run).__name__}, expected a "
                                 "mapping of knob names to values")
    return data


def plan_runs(runs: Sequence[Mapping[str, Any]], preset: str) -> list[dict]:
    """Every run checked and completed: ``{"name": ..., <every knob>: value}``, in order."""
    if preset not in PRESETS:
        raise InvalidParameter("preset", preset, "must be one of " + ", ".join(PRESETS))
    if not isinstance(runs, Sequence) or isinstance(runs, str) or not runs:
        raise InvalidParameter("configs", runs, "must be a non-empty list of runs, each a "
                                                "mapping of knob names to values")
    base = {name: PRESETS[preset].default(name) for name in KNOBS}
    planned, names, seen = [], set(), {}
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            raise InvalidParameter(f"configs[{i}]", run, "must be a mapping of knob names to "
                                                         "values")
        knobs = {k: v for k, v in run.items() if k != NAME}
        try:
            unknown = check_params(knobs, base=base)
        except InvalidParameter as err:
            raise InvalidParameter(f"configs[{i}].{err.name}", err.value, err.valid) from err
        if unknown:
            raise InvalidParameter(f"configs[{i}].{unknown[0]}", knobs[unknown[0]],
                                   "is not a fine-tune knob (see `draslice train --help`)")
        name = _name(run.get(NAME, f"run-{i}"), i)
        if name in names:
            raise InvalidParameter(f"configs[{i}].name", name, "must be unique in the sweep")
        values = {k: typed(k, v) for k, v in {**base, **knobs}.items()}
        key = json.dumps(values, sort_keys=True)
        if key in seen:
            raise InvalidParameter(f"configs[{i}]", dict(run),
                                   f"repeats run {seen[key]}: every run must differ")
        names.add(name)
        seen[key] = name
        if values["checkpoint_dir"]:
            values["checkpoint_dir"] = posixpath.join(values["checkpoint_dir"], name)
        planned.append({NAME: name, **values})
    return planned


def _name(value: Any, index: int) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidParameter(f"configs[{index}].name", value,
                               "must be 1-63 lower-case letters, digits, '-', '_' or '.'")
    return value


def typed(name: str, value: Any) -> Any:
    """An integer knob given as a whole float (JSON through KFP's protobuf) as the integer."""
    if KNOBS[name].type is int and isinstance(value, float):
        return int(value)
    return value
