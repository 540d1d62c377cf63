"""CEL as the Kubernetes DRA scheduler evaluates it: selectors compiled once, run per device.

The runtime is Google's C++ CEL (PyPI ``cel-expr-python``). On top of it this module adds what
Kubernetes adds in ``k8s.io/dynamic-resource-allocation/cel``:

- the variable ``device`` with ``driver``, ``attributes[domain][name]``,
  ``capacity[domain][name]`` and ``allowMultipleAllocations``;
- quantities (``quantity("10Gi")``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``,
  ``sub``, ``asInteger``, ``asApproximateFloat``, ``isInteger``, ``sign``, ``isQuantity``) — the
  values of ``device.capacity``;
- semantic versions (``semver("1.2.3")``, ``compareTo``, ``isGreaterThan``, ``isLessThan``,
  ``major``, ``minor``, ``patch``, ``isSemver``) — the values of ``version`` attributes;
- an unknown attribute *domain* is an empty map, while an unknown attribute *name* is a runtime
  error: the scheduler fails the allocation on it, so we report it and never read it as false.

Quantities and versions are small protobuf messages holding a canonical text, so that ``==``
between two of them compares values (``quantity("1Gi") == quantity("1024Mi")``), as in Kubernetes.

Expressions are type-checked against a *typed* ``device`` (a message with exactly the four
fields), so ``device.atributes`` fails at compile time — before a template reaches a cluster —
and evaluated in a second environment where ``device`` is a plain map built once per device.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache

import semver as _semver
from cel_expr_python import cel
from cel_expr_python.ext import ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2
from kubernetes.utils import parse_quantity

from draslice.errors import DrasliceError, InvalidParameter

# Kubernetes' limit on one selector expression (resource.k8s.io: CELSelectorExpressionMaxLength).
MAX_EXPRESSION_BYTES = 10 * 1024

_PKG = "draslice.k8s"
_T = descriptor_pb2.FieldDescriptorProto


def _build_pool() -> descriptor_pool.DescriptorPool:
    """Message types for quantity, semver and the typed ``device`` of the compile-time check."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    f = descriptor_pb2.FileDescriptorProto(
        name="draslice/k8s_cel.proto", package=_PKG, syntax="proto3",
        dependency=["google/protobuf/struct.proto"],
    )
    for name in ("Quantity", "Semver"):
        f.message_type.add(name=name).field.add(
            name="text", number=1, type=_T.TYPE_STRING, label=_T.LABEL_OPTIONAL
        )
    dev = f.message_type.add(name="Device")
    dev.field.add(name="driver", number=1, type=_T.TYPE_STRING, label=_T.LABEL_OPTIONAL)
    for number, field in ((2, "attributes"), (3, "capacity")):
        entry = dev.nested_type.add(name=field.capitalize() + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_T.TYPE_STRING, label=_T.LABEL_OPTIONAL)
        entry.field.add(
            name="value", number=2, type=_T.TYPE_MESSAGE, label=_T.LABEL_OPTIONAL,
            type_name=".google.protobuf.Struct",
        )
        dev.field.add(
            name=field, number=number, type=_T.TYPE_MESSAGE, label=_T.LABEL_REPEATED,
            type_name=f".{_PKG}.Device.{entry.name}",
        )
    dev.field.add(
        name="allowMultipleAllocations", number=4, type=_T.TYPE_BOOL, label=_T.LABEL_OPTIONAL
    )
    pool.Add(f)
    return pool


_POOL = _build_pool()
_Quantity = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.Quantity"))
_Semver = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.Semver"))
_QT = cel.Type(f"{_PKG}.Quantity")
_ST = cel.Type(f"{_PKG}.Semver")


# --- quantities ------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def _canonical_quantity(text: str) -> str:
    """``"10Gi"`` -> ``"10737418240"``: one spelling per value, so ``==`` compares values."""
    try:
        value = parse_quantity(text)
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise ValueError(f"invalid quantity {text!r}: {exc}") from None
    return format(value.normalize(), "f")


def quantity_value(text: str):
    """A quantity message for CEL from its Kubernetes spelling (``"81559Mi"``, ``"14"``)."""
    return _Quantity(text=_canonical_quantity(str(text)))


@lru_cache(maxsize=4096)
def _dec(canonical: str) -> Decimal:
    return Decimal(canonical)


def _q(msg) -> Decimal:
    return _dec(msg.text)


def _from_dec(value: Decimal):
    return _Quantity(text=format(value.normalize(), "f"))


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def _is_quantity(text: str) -> bool:
    try:
        _canonical_quantity(text)
    except ValueError:
        return False
    return True


def _as_integer(msg) -> int:
    value = _q(msg)
    if value != value.to_integral_value() or not (-(2**63) <= value < 2**63):
        raise ValueError(f"quantity {msg.text} is not representable as an int64")
    return int(value)


# --- semantic versions -----------------------------------------------------------------------

@lru_cache(maxsize=4096)
def _parse_semver(text: str) -> _semver.Version:
    try:
        return _semver.Version.parse(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid semver {text!r}: {exc}") from None


@lru_cache(maxsize=4096)
def _canonical_semver(text: str) -> str:
    return str(_parse_semver(text).replace(build=None))


def semver_value(text: str):
    """A semver message for CEL (build metadata dropped: it does not order versions)."""
    return _Semver(text=_canonical_semver(str(text)))


def _v(msg) -> _semver.Version:
    return _parse_semver(msg.text)


def _is_semver(text: str) -> bool:
    try:
        _parse_semver(text)
    except ValueError:
        return False
    return True


def _compare(a, b) -> int:
    """``compareTo`` for two quantities or two versions (the checker forbids mixing them)."""
    if a.DESCRIPTOR.name == "Semver":
        return _v(a).compare(_v(b))
    return _cmp(_q(a), _q(b))


def _fn(name: str, overloads: Iterable[tuple]) -> cel.FunctionDecl:
    """``(id, return type, parameters, member?, impl or None)`` tuples -> one CEL function."""
    return cel.FunctionDecl(
        name,
        [
            cel.Overload(oid, ret, params, is_member=member, **({"impl": impl} if impl else {}))
            for oid, ret, params, member, impl in overloads
        ],
    )


_B, _I, _D, _S = cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE, cel.Type.STRING

def _functions() -> list[cel.FunctionDecl]:
    """Fresh declarations per environment (the runtime registers each one once)."""
    return [
        _fn("quantity", [("quantity_string", _QT, [_S], False, quantity_value)]),
        _fn("isQuantity", [("is_quantity_string", _B, [_S], False, _is_quantity)]),
        _fn("semver", [("semver_string", _ST, [_S], False, semver_value)]),
        _fn("isSemver", [("is_semver_string", _B, [_S], False, _is_semver)]),
        # The runtime dispatches on value kinds, and both types are messages: one
        # implementation per name serves both overloads (the checker still keeps them apart).
        _fn("compareTo", [
            ("quantity_compareTo", _I, [_QT, _QT], True, _compare),
            ("semver_compareTo", _I, [_ST, _ST], True, None),
        ]),
        _fn("isGreaterThan", [
            ("quantity_isGreaterThan", _B, [_QT, _QT], True, lambda a, b: _compare(a, b) > 0),
            ("semver_isGreaterThan", _B, [_ST, _ST], True, None),
        ]),
        _fn("isLessThan", [
            ("quantity_isLessThan", _B, [_QT, _QT], True, lambda a, b: _compare(a, b) < 0),
            ("semver_isLessThan", _B, [_ST, _ST], True, None),
        ]),
        _fn("add", [
            ("quantity_add", _QT, [_QT, _QT], True, lambda a, b: _from_dec(_q(a) + _q(b))),
            ("quantity_add_int", _QT, [_QT, _I], True, lambda a, n: _from_dec(_q(a) + n)),
        ]),
        _fn("sub", [
            ("quantity_sub", _QT, [_QT, _QT], True, lambda a, b: _from_dec(_q(a) - _q(b))),
            ("quantity_sub_int", _QT, [_QT, _I], True, lambda a, n: _from_dec(_q(a) - n)),
        ]),
        _fn("asInteger", [("quantity_asInteger", _I, [_QT], True, _as_integer)]),
        _fn("isInteger", [
            ("quantity_isInteger", _B, [_QT], True,
             lambda a: _q(a) == _q(a).to_integral_value() and -(2**63) <= _q(a) < 2**63),
        ]),
        _fn("asApproximateFloat", [
            ("quantity_asApproximateFloat", _D, [_QT], True, lambda a: float(_q(a))),
        ]),
        _fn("sign", [("quantity_sign", _I, [_QT], True, lambda a: _cmp(_q(a), 0))]),
        _fn("major", [("semver_major", _I, [_ST], True, lambda v: _v(v).major)]),
        _fn("minor", [("semver_minor", _I, [_ST], True, lambda v: _v(v).minor)]),
        _fn("patch", [("semver_patch", _I, [_ST], True, lambda v: _v(v).patch)]),
    ]


def _env(device_type: cel.Type):
    return cel.NewEnv(
        _POOL, variables={"device": device_type}, functions=_functions(),
        extensions=[ext_strings.ExtStrings()],
    )


# Compile-time check: ``device`` is a message, so a misspelt field is a compile error.
_CHECK_ENV = _env(cel.Type(f"{_PKG}.Device"))
# Evaluation: ``device`` is the map built once per device by :func:`device_activation`.
_EVAL_ENV = _env(cel.Type.Map(cel.Type.STRING, cel.Type.DYN))


class CelCompileError(InvalidParameter):
    """A selector expression that does not compile (exit 2, like any bad input)."""


class CelRuntimeError(DrasliceError):
    """A selector failed on a device: the scheduler fails the allocation on it too."""

    exit_code = 1

    def __init__(self, expression: str, device: str, message: str):
        self.expression, self.device, self.detail = expression, device, message
        super().__init__(f"CEL selector {expression!r} failed on device {device}: {message}")


def _clean_compile_error(expression: str, exc: Exception) -> str:
    text = str(exc).strip()
    text = re.sub(r"^[A-Z_]+: ", "", text)
    text = re.sub(r" \[[A-Z_]+\]$", "", text)
    return text


# A CEL string literal, single- or double-quoted, not raw (raw literals hold no escapes).
_STRING_LITERAL = re.compile(r"""[rR]?("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")


@dataclass(frozen=True)
class Selector:
    """One compiled selector; :meth:`matches` evaluates it for one device."""

    expression: str
    program: cel.Expression
    domains: frozenset[str]  # string literals: candidate attribute domains (see device_activation)
    # Attribute/capacity names the expression can reach, or None when it may reach any (it
    # iterates a map, asks its size, or indexes with a computed key). See cel_values.
    names: frozenset[str] | None = None

    def matches(self, activation: DeviceActivation) -> bool:
        result = self.program.eval(activation.activation)
        if result.type() == cel.Type.ERROR:
            raise CelRuntimeError(
                self.expression, activation.name, _clean_compile_error("", result.value())
            )
        value = result.value()
        if not isinstance(value, bool):
            raise CelRuntimeError(
                self.expression, activation.name, f"returned {value!r}, not a bool"
            )
        return value


def check_expression(expression: str) -> None:
    """Raise :class:`InvalidParameter` (naming the expression and why) unless it compiles to bool.

    The manifests renderer calls this for every selector it writes, so a typo fails at render
    time instead of at allocation time on a cluster.
    """
    compile_selector(expression)


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile (and type-check) once; evaluate per device with :meth:`Selector.matches`."""
    if not isinstance(expression, str) or not expression.strip():
        raise CelCompileError("cel.expression", expression, "must be a non-empty CEL expression")
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        raise CelCompileError(
            "cel.expression", expression[:60] + "...",
            f"is {size} bytes; Kubernetes allows at most {MAX_EXPRESSION_BYTES}",
        )
    try:
        checked = _CHECK_ENV.compile(expression)
    except RuntimeError as exc:
        raise CelCompileError(
            "cel.expression", expression,
            "does not compile: " + _clean_compile_error(expression, exc),
        ) from None
    if checked.return_type() != cel.Type.BOOL:
        raise CelCompileError(
            "cel.expression", expression,
            f"must evaluate to bool (a selector), not {checked.return_type().name()}",
        )
    literals = [_literal_text(m.group(0)) for m in _STRING_LITERAL.finditer(expression)]
    names = _reachable_names(expression, literals)
    # Domains: the literals that index device.attributes/capacity; when keys may be computed,
    # every literal is a candidate.
    domains = literals if names is None else [
        _literal_text(m.group(1)) for m in _DOMAIN_INDEX.finditer(expression)
    ]
    # Checked above against the typed device; the evaluation program skips the checker, whose
    # map(string, dyn) view of `device` would refuse macros over device.attributes[...].
    program = _EVAL_ENV.compile(expression, disable_check=True)
    return Selector(expression, program, frozenset(domains), names)


# Whatever can see a map's keys without naming them: macros, size(), `in`, and (for the check
# below) string functions and indexing by anything but a literal.
_WHOLE_MAP = re.compile(r"\b(all|exists|exists_one|map|filter|size|in)\b")
_INDEX = re.compile(r"\[([^\[\]]*)\]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOMAIN_INDEX = re.compile(
    r"\b(?:attributes|capacity)\s*\[\s*(" + _STRING_LITERAL.pattern + r")\s*\]"
)


def _reachable_names(expression: str, literals: list[str]) -> frozenset[str] | None:
    """Names of attributes/capacities a selector can read: its identifiers and string literals.

    Converting a device for CEL costs per value (and most is spent on values no selector reads),
    so devices are handed to CEL with only these. A selector that could reach a key it does
    not spell out returns None and gets every value.
    """
    bare = _STRING_LITERAL.sub('""', expression)
    if _WHOLE_MAP.search(bare):
        return None
    if any(inner.strip() != '""' for inner in _INDEX.findall(bare)):
        return None
    return frozenset(_IDENTIFIER.findall(bare)) | frozenset(literals)


def _literal_text(token: str) -> str:
    raw = token[0] in "rR"
    body = token[2:-1] if raw else token[1:-1]
    if raw or "\\" not in body:
        return body
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape")


@dataclass
class DeviceActivation:
    """A device as CEL sees it, built once and reused for every selector."""

    name: str
    activation: cel.Activation


def cel_values(
    attributes: Mapping[str, Mapping[str, object]],
    capacity: Mapping[str, Mapping[str, str]],
    names: frozenset[str] | None = None,
) -> tuple[dict, dict]:
    """A device's attributes and capacity as CEL values (versions and quantities as messages).

    ``attributes``: domain -> name -> ``bool | int | str | Version``; ``capacity``: domain ->
    name -> quantity text. ``names``: keep only these names (the union of
    :attr:`Selector.names` of the selectors that will run); None keeps all.
    """
    attrs = {
        domain: {k: (semver_value(v.text) if isinstance(v, Version) else v)
                 for k, v in d.items() if names is None or k in names}
        for domain, d in attributes.items()
    }
    caps = {
        domain: {k: quantity_value(v) for k, v in d.items() if names is None or k in names}
        for domain, d in capacity.items()
    }
    return attrs, caps


def device_activation(
    name: str,
    driver: str,
    attributes: Mapping[str, Mapping[str, object]],
    capacity: Mapping[str, Mapping[str, str]],
    allow_multiple_allocations: bool = False,
    domains: Iterable[str] = (),
    values: tuple[dict, dict] | None = None,
) -> DeviceActivation:
    """Bind ``device`` for evaluation.

    ``domains``: the union of :attr:`Selector.domains` of the selectors that will run; each
    one the device lacks becomes an empty map, which is how Kubernetes answers an unknown
    domain (its map type returns an empty map instead of an error), so
    ``device.attributes["other.vendor"].x`` fails as an unknown *attribute*, exactly as there.
    ``values``: :func:`cel_values` of the device, when the caller kept them.
    """
    attrs, caps = values or cel_values(attributes, capacity)
    missing = [d for d in domains if d not in attrs or d not in caps]
    if missing:
        attrs, caps = dict(attrs), dict(caps)
        for domain in missing:
            attrs.setdefault(domain, {})
            caps.setdefault(domain, {})
    device = {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": allow_multiple_allocations,
    }
    return DeviceActivation(name, _EVAL_ENV.Activation({"device": device}))


@dataclass(frozen=True)
class Version:
    """A ``version`` attribute value (a semver string), kept apart from plain strings."""

    text: str
