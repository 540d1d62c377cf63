"""The config is the one declaration of each knob: ranges are checked when it is built, and
the CLI's options are exactly the config's (name, type, default, range in --help)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import click
import pytest

from draslice.cli.commands.advise_cmd import ADVISE_KNOBS, advise
from draslice.cli.commands.run_cmd import run
from draslice.cli.commands.steps_cmd import train
from draslice.cli.knobs import flag
from draslice.errors import InvalidParameter
from draslice.trainer.config import (
    FINETUNE_KNOBS,
    KNOBS,
    ModelShape,
    SFTConfig,
    VerdictConfig,
    check_params,
)
from draslice.trainer.presets import DEMO, FINETUNE, PRESETS


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option)}


def _out_of_range(name: str):
    """A value just outside the knob's declared range (or choices)."""
    knob = KNOBS[name]
    if knob.choices:
        return "not-a-choice"
    if knob.ge is not None:
        return knob.type(knob.ge - 1) if knob.type is int else knob.ge - 1e-9
    if knob.gt is not None:
        return knob.type(knob.gt)
    return None


RANGED = [n for n in KNOBS if _out_of_range(n) is not None]


@pytest.mark.parametrize("name", RANGED)
def test_every_declared_range_is_enforced_when_the_config_is_built(name):
    bad = _out_of_range(name)
    with pytest.raises(InvalidParameter, match=f"invalid {name}=") as err:
        check_params({name: bad}, base={})
    assert err.value.valid == KNOBS[name].valid
    if name in FINETUNE_KNOBS:
        with pytest.raises(InvalidParameter, match=f"invalid {name}="):
            SFTConfig.from_params({name: bad})
    else:
        with pytest.raises(InvalidParameter, match=f"invalid {name}="):
            VerdictConfig(**{name: bad})


@pytest.mark.parametrize("name", [n for n in KNOBS if KNOBS[n].lt is not None])
def test_an_upper_bound_is_enforced_too(name):
    with pytest.raises(InvalidParameter, match=f"invalid {name}="):
        check_params({name: KNOBS[name].lt})


@pytest.mark.parametrize(("params", "name"), [
    ({"learning_rate": math.nan}, "learning_rate"),
    ({"lora_r": True}, "lora_r"),
    ({"steps": 2.5}, "steps"),
    ({"pack": "yes"}, "pack"),
    ({"device": "tpu"}, "device"),
])
def test_types_and_non_finite_numbers_are_refused(params, name):
    with pytest.raises(InvalidParameter) as err:
        check_params(params)
    assert err.value.name == name


def test_rules_that_tie_knobs_together_need_the_whole_config():
    assert check_params({"warmup_steps": 50}) == []  # alone, 50 is a valid warmup
    with pytest.raises(InvalidParameter, match="warmup_steps=50: must be in \\[0, steps=30\\)"):
        check_params({"warmup_steps": 50}, base=DEMO.values)
    check_params({"warmup_steps": 50}, base=FINETUNE.values)  # 200 steps there
    with pytest.raises(InvalidParameter, match="n_head"):
        ModelShape(n_embd=250, n_head=4)


def test_check_params_takes_a_compiled_pipelines_defaults_as_its_base():
    """KFP writes integer defaults as whole floats; they count as the integers they are."""
    import yaml

    from draslice.tests.conftest import REPO

    spec = next(yaml.safe_load_all(
        (REPO / "compiled" / "finetune.policy.mig-1g-6gb.yaml").read_text()))
    defaults = {name: p.get("defaultValue") for name, p in
                spec["root"]["inputDefinitions"]["parameters"].items()}
    assert defaults["steps"] == 200.0
    assert check_params({"steps": 300}, base=defaults) == []
    with pytest.raises(InvalidParameter, match="warmup_steps=10: must be in \\[0, steps=5\\)"):
        check_params({"steps": 5}, base=defaults)
    with pytest.raises(InvalidParameter, match="invalid steps=2.5"):
        check_params({"steps": 2.5}, base=defaults)


def test_check_params_returns_what_is_no_knob():
    assert check_params({"steps": 3, "on_missing_dra": "skip"}, base={}) == ["on_missing_dra"]


def test_a_recorded_config_round_trips():
    cfg = SFTConfig.from_params(
        {k: FINETUNE.default(k) for k in FINETUNE.exposed if k in FINETUNE_KNOBS})
    assert SFTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(InvalidParameter, match="warmup_steps"):
        replace(cfg, steps=5)  # checked again: warmup 10 is no longer below steps


def test_every_preset_is_a_valid_config():
    for preset in PRESETS.values():
        assert set(preset.values) <= set(preset.exposed), preset.name
        check_params(preset.defaults(), base=preset.values)


def _assert_options_are_the_knobs(command: click.Command, names, defaults) -> None:
    options = _options(command)
    for name in names:
        knob, option = KNOBS[name], options[name]
        assert option.opts[0] == flag(name), name
        assert option.default == defaults[name], name
        if knob.type is bool:
            assert option.is_flag and option.secondary_opts == [f"--no-{flag(name)[2:]}"]
        else:
            assert option.type.name == {int: "integer", float: "float", str: "text"}[knob.type]
        assert knob.help in option.help
        assert knob.valid.removeprefix("must be ") in option.help


def test_train_offers_every_knob_with_the_configs_defaults():
    names = [n for n in _options(train) if n in KNOBS]
    assert names == list(FINETUNE_KNOBS)
    _assert_options_are_the_knobs(train, FINETUNE_KNOBS, {n: KNOBS[n].default for n in KNOBS})


def test_advise_offers_the_memory_knobs_with_the_configs_defaults():
    names = {n for n in _options(advise) if n in KNOBS}
    assert names == {*ADVISE_KNOBS, "memory_headroom"}
    _assert_options_are_the_knobs(advise, names, {n: KNOBS[n].default for n in KNOBS})


def test_run_offers_the_demo_presets_knobs_with_its_values():
    names = [n for n in _options(run) if n in KNOBS]
    assert names == list(DEMO.exposed)
    _assert_options_are_the_knobs(run, DEMO.exposed, DEMO.defaults())


def test_config_presets_and_options_import_neither_torch_nor_kfp():
    code = ("import sys; import draslice.trainer.config, draslice.trainer.presets, "
            "draslice.cli.knobs, draslice.cli.commands.steps_cmd, "
            "draslice.cli.commands.advise_cmd, draslice.cli.commands.run_cmd; "
            "print(sorted(m for m in ('torch', 'kfp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_memory_levers_are_knobs_spelled_as_train_flags():
    """advise and the out-of-memory error name levers as flags a user can type."""
    from draslice.trainer.budget import knobs_to_try

    train_flags = {o.opts[0] for o in _options(train).values()}
    levers = knobs_to_try(SFTConfig(model_dir="m", data="d"))
    assert len(levers) == 7
    for lever in levers:
        for name in lever.changes:
            assert name in KNOBS and flag(name) in train_flags
            assert flag(name) in lever.flag.split()


def test_a_long_sequence_at_batch_1_is_told_the_levers_that_make_it_fit():
    """At batch 1 there is no batch to halve: what makes a long row fit is checkpointing, the
    offloaded layer inputs and the MLP in tiles (its intermediate is a long row's largest
    activation), then a shorter --max-length, in that order."""
    from draslice.trainer.budget import knobs_to_try

    levers = knobs_to_try(SFTConfig(model_dir="m", data="d", max_length=32768, batch_size=1,
                                    bf16_weights=True))
    assert [lever.flag for lever in levers] == [
        "--gradient-checkpointing", "--gradient-checkpointing --offload-activations",
        "--gradient-checkpointing --tile-mlp", "--load-in-4bit", "--max-length 16384"]
    assert "a long sequence's largest" in levers[2].why
