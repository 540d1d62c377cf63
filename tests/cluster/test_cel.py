"""The CEL runtime with the Kubernetes DRA environment: quantities, semver, domains, errors."""

from __future__ import annotations

import pytest

from draslice.cluster.cel import (
    CelCompileError,
    CelRuntimeError,
    Version,
    check_expression,
    compile_selector,
    device_activation,
)
from draslice.errors import InvalidParameter

DRIVER = "gpu.nvidia.com"


def _device(memory="16Gi", driver_version="580.126.20", **attrs):
    return {
        "name": "node-a/gpu.nvidia.com/gpu-0",
        "driver": DRIVER,
        "attributes": {
            DRIVER: {"type": "gpu", "driverVersion": Version(driver_version), **attrs},
            "resource.kubernetes.io": {"pcieRoot": "pci0000:00"},
        },
        "capacity": {DRIVER: {"memory": memory}},
    }


def _eval(expression: str, **device) -> bool:
    selector = compile_selector(expression)
    return selector.matches(device_activation(**(device or _device()), domains=selector.domains))


@pytest.mark.parametrize(
    "memory, expected", [("16Gi", True), ("10Gi", True), ("10239Mi", False), ("9728Mi", False)]
)
def test_quantity_compare_to(memory, expected):
    expr = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) >= 0'
    assert _eval(expr, **_device(memory=memory)) is expected


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
        ('quantity("-2Ki").sign() == -1', True),
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
    ],
)
def test_semver(expression, expected):
    assert _eval(expression) is expected


def test_unknown_domain_is_an_empty_map():
    assert _eval('size(device.attributes["dra.example.com"]) == 0') is True
    assert _eval('"x" in device.attributes["dra.example.com"]') is False


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',
        'device.attributes["dra.example.com"].model == "x"',
        'device.capacity["gpu.nvidia.com"].multiprocessors.isGreaterThan(quantity("1"))',
    ],
)
def test_unknown_attribute_is_an_error_naming_device_and_expression(expression):
    with pytest.raises(CelRuntimeError) as err:
        _eval(expression)
    message = str(err.value)
    assert expression in message
    assert "node-a/gpu.nvidia.com/gpu-0" in message
    assert "not found" in message


def test_has_guards_an_optional_attribute():
    expr = 'has(device.attributes["gpu.nvidia.com"].profile) && ' \
           'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    assert _eval(expr) is False


def test_invalid_quantity_literal_is_a_runtime_error():
    with pytest.raises(CelRuntimeError, match="invalid quantity 'ten'"):
        _eval('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("ten"))')


def test_standard_and_string_extension_functions():
    assert _eval('device.driver.endsWith(".nvidia.com") && device.driver.lowerAscii() == '
                 '"gpu.nvidia.com" && device.attributes["resource.kubernetes.io"].pcieRoot'
                 '.matches("^pci[0-9]+:")') is True


@pytest.mark.parametrize(
    "expression, why",
    [
        ("device.atributes['gpu.nvidia.com'].type == 'gpu'", "undefined field 'atributes'"),
        ("device.driver ==", "Syntax error"),
        ("device.driver", "must evaluate to bool"),
        ('quantity("1Gi").compareTo(semver("1.0.0")) > 0', "no matching overload"),
        ("", "non-empty"),
        ("true || " * 1400 + "true", "at most 10240"),
    ],
)
def test_check_expression_rejects_with_the_expression_and_the_reason(expression, why):
    with pytest.raises(InvalidParameter) as err:
        check_expression(expression)
    assert isinstance(err.value, CelCompileError)
    assert why in str(err.value)
    assert "cel.expression" in str(err.value)


def test_check_expression_accepts_the_templates_selector():
    from draslice.cluster.templates import mig_selector

    assert check_expression(mig_selector("1g.10gb")) is None
    assert check_expression(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    ) is None


def test_compile_once():
    expr = 'device.driver == "gpu.nvidia.com"'
    assert compile_selector(expr) is compile_selector(expr)


@pytest.mark.parametrize(
    "expression, names",
    [
        ('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',
         {"device", "attributes", "gpu.nvidia.com", "profile", "1g.10gb"}),
        ('device.attributes["gpu.nvidia.com"].exists(k, k == "uuid")', None),
        ('size(device.capacity["gpu.nvidia.com"]) > 1', None),
        ('"uuid" in device.attributes["gpu.nvidia.com"]', None),
        ('device.attributes["gpu.nvidia.com"]["pro" + "file"] == "x"', None),
    ],
)
def test_reachable_names(expression, names):
    selector = compile_selector(expression)
    assert selector.names == (None if names is None else frozenset(names))


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["gpu.nvidia.com"].exists(k, k == "uuid")',
        'size(device.attributes["gpu.nvidia.com"]) == 3',
        'device.attributes["gpu.nvidia.com"]["driver" + "Version"].major() == 580',
    ],
)
def test_selectors_that_see_whole_maps_get_every_value(expression):
    from draslice.cluster.cel import cel_values

    dev = _device(uuid="GPU-1")
    selector = compile_selector(expression)
    values = cel_values(dev["attributes"], dev["capacity"], selector.names)
    act = device_activation(**dev, domains=selector.domains, values=values)
    assert selector.matches(act) is True
