"""CEL selectors through the allocator program: Kubernetes' own DRA CEL environment decides
(quantities, semver, domains, errors, cost limits), and draslice reports its answer.

Each expectation is what ``k8s.io/dynamic-resource-allocation/cel`` answers; several are cases
the former hand-made environment got wrong (bare bool selectors, ``in`` on the attributes map,
``cel.bind``, ``semver(s, true)``, ``find``, a loop over the cost limit)."""

from __future__ import annotations

import pytest

from draslice.cluster.cel import CelCompileError, check_expression
from draslice.errors import InvalidParameter
from draslice.tests.cluster.conftest import (
    analyze_objects,
    exactly,
    rslice,
    selected,
    template_with,
)

DRIVER = "gpu.nvidia.com"
DEVICE = "node-a/gpu-0"


def _slice(memory="16Gi", driver_version="580.126.20", **attrs):
    device = {
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "gpu"}, "driverVersion": {"version": driver_version},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            **{k: {("bool" if isinstance(v, bool) else "string"): v} for k, v in attrs.items()},
        },
        "capacity": {"memory": {"value": memory}},
    }
    return rslice("node-a", [device])


def _eval(expression: str, **device) -> bool:
    return selected([_slice(**device)], expression) == {DEVICE}


def _runtime_error(expression: str, **device) -> str:
    report = analyze_objects([_slice(**device)], template_with(exactly("gpu", "any", expression)))
    assert report.decision == "fail", report.reason
    return report.reason


@pytest.mark.parametrize(
    "memory, expected", [("16Gi", True), ("10Gi", True), ("10239Mi", False), ("9728Mi", False)]
)
def test_quantity_compare_to(memory, expected):
    expr = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) >= 0'
    assert _eval(expr, memory=memory) is expected


@pytest.mark.parametrize(
    "expression, expected",
    [
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("15Gi"))', True),
        ('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("15Gi"))', False),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("16384Mi")', True),
        ('device.capacity["gpu.nvidia.com"].memory.asInteger() == 17179869184', True),
        ('device.capacity["gpu.nvidia.com"].memory.asApproximateFloat() > 1.7e10', True),
        ('device.capacity["gpu.nvidia.com"].memory.sub(quantity("6Gi")) == quantity("10Gi")',
         True),
        ('quantity("500m").add(quantity("500m")) == quantity("1")', True),
        ('quantity("1.5").isInteger()', False),
        ('quantity("-2Ki").isLessThan(quantity("0"))', True),
        ('isQuantity("10Gi") && !isQuantity("ten")', True),
    ],
)
def test_quantity_functions(expression, expected):
    assert _eval(expression) is expected


@pytest.mark.parametrize(
    "expression, expected",
    [
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("580.0.0"))',
         True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isLessThan(semver("580.126.3"))',
         False),  # numeric, not string, order: 126.20 > 126.3
        ('device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("580.126.20")) == 0',
         True),
        ('device.attributes["gpu.nvidia.com"].driverVersion == semver("580.126.20")', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.major() == 580', True),
        ('semver("1.2.3-rc.1").isLessThan(semver("1.2.3"))', True),
        ('isSemver("1.2.3") && !isSemver("1.2")', True),
        # normalize=true accepts what strict parsing refuses (a "v" prefix, missing parts)
        ('isSemver("v1.2", true) && semver("v1.2", true) == semver("1.2.0")', True),
    ],
)
def test_semver(expression, expected):
    assert _eval(expression) is expected


def test_unknown_domain_is_an_empty_map():
    assert _eval('size(device.attributes["dra.example.com"]) == 0') is True
    assert _eval('"x" in device.attributes["dra.example.com"]') is False


def test_in_on_the_attributes_map_asks_for_a_domain():
    """`"x" in device.attributes` is true only for a domain the device has (the former
    environment answered true for any string)."""
    assert _eval('"gpu.nvidia.com" in device.attributes') is True
    assert _eval('"x" in device.attributes') is False


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',
        'device.attributes["dra.example.com"].model == "x"',
        'device.capacity["gpu.nvidia.com"].multiprocessors.isGreaterThan(quantity("1"))',
    ],
)
def test_unknown_attribute_is_the_allocators_runtime_error(expression):
    reason = _runtime_error(expression)
    assert "selector #0 on device gpu.nvidia.com/node-a/gpu-0: CEL runtime error" in reason
    assert "no such key" in reason


def test_has_guards_an_optional_attribute():
    expr = 'has(device.attributes["gpu.nvidia.com"].profile) && ' \
           'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    assert _eval(expr) is False


def test_invalid_quantity_literal_is_a_runtime_error():
    reason = _runtime_error(
        'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("ten"))')
    assert "CEL runtime error" in reason and "quantities must match" in reason


def test_standard_and_string_extension_functions():
    assert _eval('device.driver.endsWith(".nvidia.com") && device.driver.lowerAscii() == '
                 '"gpu.nvidia.com" && device.attributes["resource.kubernetes.io"].pcieRoot'
                 '.matches("^pci[0-9]+:")') is True


def test_cel_bind_and_find():
    assert _eval('cel.bind(a, device.attributes["gpu.nvidia.com"], '
                 'a.type == "gpu" && a.driverVersion.major() >= 580)') is True
    assert _eval('device.attributes["resource.kubernetes.io"].pcieRoot.find("[0-9]+") == "0000"'
                 ) is True


def test_bare_bool_attribute_is_a_selector():
    assert _eval('device.attributes["gpu.nvidia.com"].shared', shared=True) is True
    assert _eval('device.attributes["gpu.nvidia.com"].shared', shared=False) is False


def test_a_loop_over_the_cost_limit_is_an_error_not_a_crash():
    """A selector the API server would accept but that runs past the runtime cost limit is the
    allocator's error for that device, reported, never a crash of preflight."""
    loop = ('[' + ', '.join(['1'] * 60) + '].all(i, [' + ', '.join(['1'] * 60) + '].all(j, '
            '[' + ', '.join(['1'] * 60) + '].all(k, device.driver.matches("^gpu"))))')
    reason = _runtime_error(loop)
    assert "CEL runtime error" in reason and "cost" in reason


@pytest.mark.parametrize(
    "expression, why",
    [
        ("device.atributes['gpu.nvidia.com'].type == 'gpu'", "undefined field 'atributes'"),
        ("device.driver ==", "Syntax error"),
        ("device.driver", "must evaluate to bool"),
        ('quantity("1Gi").compareTo(semver("1.0.0")) > 0', "found no matching overload"),
        ("", "non-empty"),
        ("true || " * 1400 + "true", "Too long: may not be more than 10240 bytes"),
        ('device.attributes["gpu.nvidia.com"].all(k, device.attributes["gpu.nvidia.com"]'
         '.all(j, device.attributes["gpu.nvidia.com"].all(l, k.matches(j) && j.matches(l))))',
         "too complex, exceeds cost limit"),
    ],
)
def test_check_expression_refuses_what_the_api_server_refuses(expression, why):
    with pytest.raises(InvalidParameter) as err:
        check_expression(expression)
    assert isinstance(err.value, CelCompileError)
    assert why in str(err.value)
    assert "cel.expression" in str(err.value)
    assert "\n" not in str(err.value)


def test_check_expression_accepts_the_templates_selector():
    from draslice.cluster.templates import mig_selector

    assert check_expression(mig_selector("1g.10gb")) is None
    assert check_expression(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    ) is None


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_every_release_compiles_and_evaluates(version):
    expr = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) >= 0'
    assert selected([_slice()], expr, version) == {DEVICE}
    check_expression(expr, version)
