"""The cluster objects preflight reasons about, read from a file or (see live.py) a cluster.

A snapshot file is what an admin gets from::

    kubectl get deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates -A -o yaml

(a ``List``), or several YAML documents of objects or Lists, or the same as JSON (``-o
json``). Nodes and DaemonSets may be appended (``kubectl get nodes -o yaml``, ``kubectl get ds
-A -o yaml``): with them the diagnosis can compare the kubelet plugin's nodeSelector with the
GPU nodes' labels. Other kinds are ignored. A bad file is reported with its name and the
document and line at fault.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from draslice.cluster.resources import Inventory, SliceFormatError, build_inventory
from draslice.cluster.templates import DRIVER
from draslice.errors import DrasliceError

# libyaml's parser where PyYAML was built with it (its wheels are), else PyYAML's own.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PROGRESS_S = 5.0  # a snapshot read that lasts longer says how far it got, this often

KINDS = {
    "DeviceClass": "device_classes",
    "ResourceSlice": "slices",
    "ResourceClaim": "claims",
    "ResourceClaimTemplate": "templates",
    "Node": "nodes",
    "DaemonSet": "daemonsets",
}


def _nvidia_class(name: str, device_type: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": (
            f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == "
            f"'{device_type}'"
        )}}]},
    }


# The DeviceClasses the NVIDIA DRA driver's chart creates. Used only for a dump that holds
# ResourceSlices but no DeviceClass at all (`kubectl get resourceslices -o yaml` alone): a
# cluster whose driver publishes slices has these classes, and the report says it assumed them.
NVIDIA_DEVICE_CLASSES = (
    _nvidia_class("gpu.nvidia.com", "gpu"),
    _nvidia_class("mig.nvidia.com", "mig"),
    _nvidia_class("vfio.gpu.nvidia.com", "vfio"),
)


class SnapshotError(DrasliceError):
    """A snapshot file that cannot be read; the message names the file and where."""

    exit_code = 2


@dataclass
class Snapshot:
    source: str
    device_classes: list[dict] = field(default_factory=list)
    slices: list[dict] = field(default_factory=list)
    claims: list[dict] = field(default_factory=list)
    templates: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    daemonsets: list[dict] = field(default_factory=list)
    dra_api: bool = True  # False: the cluster does not serve resource.k8s.io/v1 at all
    notes: list[str] = field(default_factory=list)  # what could not be read, and why
    cache: dict = field(default_factory=dict, repr=False)  # derived once (see analysis.py)
    server_version: str | None = None  # the live cluster's gitVersion (v1.35.2), if read
    # (kind, namespace, name) -> the object added under it and where it was read; and per
    # kind, each identical copy dropped: (its name, where the first copy was, this one)
    _seen: dict[tuple[str, str, str], tuple[dict, str]] = field(default_factory=dict,
                                                                repr=False)
    _dropped: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict, repr=False)

    def add(self, obj: dict, where: str = "") -> bool:
        """Keep ``obj`` (read at ``where``) if preflight reads its kind. An API server holds one
        object per kind, namespace and name, so a second copy (two dumps concatenated) is
        dropped, and said by :meth:`duplicate_notes`, or refused when the copies differ: which
        one is the cluster's is unknowable, and counting both would count devices twice."""
        kind = obj.get("kind", "")
        attr = KINDS.get(kind)
        if attr is None:
            return False
        name, namespace = _name(obj), _namespace(obj)
        if name:
            key = (kind, namespace, name)
            first = self._seen.get(key)
            if first is not None:
                shown = f"{namespace}/{name}" if namespace else name
                if first[0] != obj:
                    at = f"{self.source}: {where}" if where else self.source
                    raise SnapshotError(
                        f"{at}: a second, different {kind} {shown} (the first is at "
                        f"{first[1] or 'an earlier one'}); a cluster holds one object per name: "
                        "keep the copy from one dump")
                self._dropped.setdefault(kind, []).append((shown, first[1], where))
                return True
            self._seen[key] = (obj, where)
        getattr(self, attr).append(obj)
        return True

    def duplicate_notes(self) -> list[str]:
        """One note per kind of which identical copies were dropped."""
        notes = []
        for kind, dropped in self._dropped.items():
            shown, first, again = dropped[0]
            more = f" and {len(dropped) - 1} more" if len(dropped) > 1 else ""
            count = f"a {kind}" if len(dropped) == 1 else f"{len(dropped)} {kind}s"
            notes.append(
                f"{self.source} holds {count} twice ({shown} at "
                f"{first or '?'} and again at {again or '?'}{more}): each counted once, as a "
                "cluster holds one object per name")
        return notes

    @cached_property
    def inventory(self) -> Inventory:
        try:
            return build_inventory(self.slices)
        except SliceFormatError as exc:
            raise SnapshotError(f"{self.source}: {exc}") from None

    def device_class(self, name: str) -> dict | None:
        return next((c for c in self.device_classes if _name(c) == name), None)

    def template(self, name: str, namespace: str | None) -> dict | None:
        for t in self.templates:
            if _name(t) == name and (namespace is None or _namespace(t) == namespace):
                return t
        return None


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _namespace(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("namespace", "")


def load_snapshot(path: str | Path, progress: Callable[[str], None] | None = None) -> Snapshot:
    """Read a ``kubectl get ... -o yaml`` (or ``-o json``) dump: a List or several documents.

    JSON is read by the json module (a 30 MB dump of 5,000 nodes in a fraction of a second),
    YAML by libyaml where PyYAML has it (about five times PyYAML's own parser, still half a
    minute of CPU for that dump). A YAML read that lasts tells ``progress`` how far it got
    every few seconds. Errors name the document, the item and its line: a JSON dump with an
    object at fault is read again the YAML way, which knows the lines."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(
            f"{path}: not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start} "
            "is not UTF-8); expected the YAML of `kubectl get deviceclasses,resourceslices,"
            "resourceclaims,resourceclaimtemplates -A -o yaml`"
        ) from None
    if text.lstrip()[:1] in ("{", "["):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None  # YAML in flow style, or broken: the YAML parser says where
        if doc is not None:
            snap = Snapshot(source=str(path))
            try:
                _add_document(snap, path, 1, doc)
            except SnapshotError:
                pass  # said below, with the line of the object at fault
            else:
                return _complete(snap, path, 1)
    snap = Snapshot(source=str(path))
    started = time.monotonic()
    loader = YAML_LOADER(_Reading(text, path, progress))
    try:
        doc_index = 0
        while loader.check_node():
            node = loader.get_node()
            doc_index += 1
            if node is not None:
                _add_document(snap, path, doc_index, loader.construct_document(node), node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SnapshotError(f"{path}:{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()
    seconds = time.monotonic() - started
    if progress is not None and seconds >= PROGRESS_S:
        progress(f"read {path} in {seconds:.0f} s: {len(snap.slices)} ResourceSlices, "
                 f"{len(snap.claims)} ResourceClaims")
    return _complete(snap, path, doc_index)


class _Reading:
    """The snapshot's text as a stream the YAML parser reads chunk by chunk; every
    ``PROGRESS_S`` seconds it tells ``progress`` how much of it was parsed."""

    def __init__(self, text: str, path: Path, progress: Callable[[str], None] | None) -> None:
        self._text = io.StringIO(text)
        self._size, self._path, self._progress = len(text), path, progress
        self._start = time.monotonic()
        self._last: float | None = self._start  # None once the end was said

    def read(self, size: int = -1) -> str:
        chunk = self._text.read(size)
        now = time.monotonic()
        if self._progress is None or now - self._start < PROGRESS_S:
            return chunk
        seconds, mb = now - self._start, self._size / 1e6
        if not chunk and self._last is not None:  # the end: what is left is building objects
            self._progress(f"reading {self._path}: parsed {mb:.0f} MB in {seconds:.0f} s; "
                           "building its objects")
            self._last = None
        elif chunk and now - self._last >= PROGRESS_S:
            self._last = now
            self._progress(f"reading {self._path}: {self._text.tell() / self._size:.0%} of "
                           f"{mb:.0f} MB parsed in {seconds:.0f} s")
        return chunk


def _complete(snap: Snapshot, path: Path, documents: int) -> Snapshot:
    """What a whole file implies: the NVIDIA classes where slices come without any, and the
    notes on objects held twice; an empty file is refused."""
    if snap.slices and not snap.device_classes and any(
        (s.get("spec") or {}).get("driver") == DRIVER for s in snap.slices
    ):
        snap.device_classes = [dict(c) for c in NVIDIA_DEVICE_CLASSES]
        snap.notes.append(
            f"{path} holds ResourceSlices but no DeviceClass: assumed the NVIDIA driver's "
            "classes gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com (dump them too: "
            "`kubectl get deviceclasses -o yaml`)"
        )
    if documents == 0:
        raise SnapshotError(f"{path}: empty file; expected the output of `kubectl get "
                            "deviceclasses,resourceslices,resourceclaims,"
                            "resourceclaimtemplates -A -o yaml`")
    snap.notes += snap.duplicate_notes()
    return snap


def _add_document(snap: Snapshot, path: Path, index: int, obj, node=None) -> None:
    """Document ``index`` of the file; with its YAML ``node``, places name their lines."""
    if obj is None:
        return
    line = f" (line {node.start_mark.line + 1})" if node is not None else ""
    where = f"{path}: document {index}{line}"
    if not isinstance(obj, dict):
        raise SnapshotError(
            f"{where}: expected a Kubernetes object or List, got a {type(obj).__name__}"
        )
    if "items" in obj and str(obj.get("kind", "List")).endswith("List"):
        items_node = None if node is None else next(
            (v for k, v in node.value if k.value == "items"), None)
        items = obj.get("items") or []
        if not isinstance(items, list):
            raise SnapshotError(f"{where}: `items` must be a list")
        for i, item in enumerate(items):
            item_line = (
                f" (line {items_node.value[i].start_mark.line + 1})"
                if items_node is not None and i < len(items_node.value) else line
            )
            _add_object(snap, f"{path}: document {index}, item {i + 1}{item_line}", item)
        return
    _add_object(snap, where, obj)


def _add_object(snap: Snapshot, where: str, obj) -> None:
    if not isinstance(obj, dict) or "kind" not in obj:
        raise SnapshotError(f"{where}: not a Kubernetes object (no `kind`)")
    if obj["kind"] == "ResourceSlice" and not isinstance(obj.get("spec"), dict):
        raise SnapshotError(f"{where}: ResourceSlice without a `spec`")
    snap.add(obj, where.removeprefix(f"{snap.source}: "))
