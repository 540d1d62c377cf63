"""A node that runs containers, joined to the real control plane of tests/realcluster:
containerd (with its CRI plugin and CDI), runc and the CNI plugins from Debian, the kubelet, and
Kubernetes' own DRA test driver as the node's kubelet plugin (scripts/node/build.sh builds the
Go parts; docs/cluster-tests.md says what each is and where it comes from).

How the node is set up, and why:

- cgroup v1 (what these machines mount): the kubelet uses the cgroupfs driver with
  ``failCgroupV1: false`` (1.35+ refuse cgroup v1 without it); pods live under their own cgroup
  root, :data:`CGROUP_ROOT`, which :meth:`Node.stop` removes.
- Pod network: one Linux bridge with host-local addresses (the Debian CNI plugins), no
  masquerading and no route off the bridge, so a pod reaches nothing but the node. The bridge
  holds the node's own address, :data:`NODE_IP`, made before the kubelet starts: the kubelet
  listens and registers there (it refuses a loopback node IP), so the API server reaches it and
  `kubectl logs` works as on any cluster.
- The sandbox ("pause") image is Debian's catatonit in pause mode, built with buildah, because
  registry.k8s.io cannot be reached; images are imported into containerd's ``k8s.io`` namespace.
- The kubelet authenticates as ``system:node:<name>`` (the API server runs the Node
  authorizer); the DRA driver, like the e2e tests' driver, uses the admin's credentials.
- Every process dies with the Python process that started it (``PR_SET_PDEATHSIG``), and
  :meth:`Node.stop` ends them, unmounts what the kubelet mounted, deletes the bridge, the cgroups
  and every folder: on success and on failure.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from draslice.tests.realcluster import certs
from draslice.tests.realcluster.controlplane import (
    ControlPlane,
    Process,
    die_with_parent,
    free_port,
)

NODE_NAME = "draslice-node"
CGROUP_ROOT = "/draslice-node"
BRIDGE = "draslice0"
POD_SUBNET = "10.88.0.0/24"
NODE_IP = "10.88.0.1"  # on the bridge: the kubelet's address; pods get the rest of the subnet
CNI_BIN = Path("/usr/lib/cni")
RUNC = Path(os.environ.get("DRASLICE_NODE_RUNC", "/usr/sbin/runc"))
PAUSE_IMAGE = "localhost/draslice/pause:catatonit"
DRIVER = "gpu.nvidia.com"  # the name the test driver registers and publishes under
K8S_NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin uses
# Paths containerd and the kubelet use whatever they are configured with (the shims' sockets
# under /run/containerd/s, the device-plugin socket under /var/lib/kubelet/device-plugins):
# removed by stop() when they did not exist before start().
FIXED_HOST_PATHS = (Path("/run/containerd"), Path("/var/lib/kubelet"), Path("/var/run/netns"))
NETNS = Path("/var/run/netns")  # where the CNI plugins' pod network namespaces are bound
REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "node" / "build.sh"


def build_node_binaries() -> Path:
    """The folder of kubelet, dradriver, containerd, its shim and ctr (built if not cached)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, text=True,
                         stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {out.returncode}); its errors are above")
    return Path(out.stdout.strip().splitlines()[-1])


def version_of(binary: Path, *args: str) -> str:
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, check=True)
    return (out.stdout or out.stderr).strip()


def _containerd_config(work: Path) -> str:
    cri = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 4
root = "{work}/containerd/root"
state = "{work}/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[plugins.'io.containerd.server.v1.grpc']
  address = "{work}/containerd/containerd.sock"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "{work}/containerd/containerd.sock.ttrpc"

[{cri}]
  cdi_spec_dirs = ["{work}/cdi"]
  # The machine's root lacks CAP_SYS_RESOURCE, so no process may lower its OOM score below its
  # parent's: containerd then caps each container's (pause: -998) at its own.
  restrict_oom_score_adj = true

[{cri}.containerd]
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  Root = "{work}/runc"
  SystemdCgroup = false

[{cri}.cni]
  bin_dirs = ["{CNI_BIN}"]
  conf_dir = "{work}/cni"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""


def _cni_config(work: Path) -> dict:
    return {"cniVersion": "1.0.0", "name": "draslice-node", "plugins": [{
        "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False,
        "ipam": {"type": "host-local",
                 "ranges": [[{"subnet": POD_SUBNET, "rangeStart": _next_address(NODE_IP)}]],
                 "dataDir": str(work / "cni-ipam")}}]}


def _next_address(ip: str) -> str:
    return str(ipaddress.ip_address(ip) + 1)


def _bridge_with_node_address() -> None:
    """The pods' bridge, up, holding the node's address (the CNI plugin reuses it as it is)."""
    prefix = POD_SUBNET.split("/")[1]
    for cmd in (["link", "add", BRIDGE, "type", "bridge"],
                ["addr", "add", f"{NODE_IP}/{prefix}", "dev", BRIDGE],
                ["link", "set", BRIDGE, "up"]):
        out = subprocess.run(["ip", *cmd], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"ip {' '.join(cmd)}: {out.stderr.strip()}")


def _kubelet_config(work: Path, endpoint: str, ca: Path) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupRoot": CGROUP_ROOT,
        "failSwapOn": False,
        "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
        "address": NODE_IP, "port": free_port(), "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        # Nothing of the machine's is evicted for, or garbage-collected: the tests' images stay.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "resolvConf": "",
        "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
        "podLogsDir": str(work / "pod-logs"),  # not /var/log/pods: nothing outlives the node
    }


def _cgroup_controllers() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    return [p for p in base.iterdir() if p.is_dir() and p.name != "unified"
            and (p / "cgroup.procs").exists()]


def _remove_cgroup_tree(root: Path) -> None:
    if not root.exists():
        return
    for sub in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def _unmount_under(folder: Path) -> None:
    """Unmount everything the kubelet and containerd mounted below ``folder``, deepest first."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if Path(target).is_relative_to(folder):
            mounts.append(target)
    for target in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


@dataclass
class Node:
    """containerd, the kubelet and the DRA driver of one node; :meth:`start` them."""

    cp: ControlPlane
    bin_dir: Path
    work: Path
    devices_file: Path
    name: str = NODE_NAME
    processes: list[Process] = field(default_factory=list)
    kubelet_version: str = ""
    containerd_version: str = ""
    published: str = ""  # the driver's own line once its ResourceSlices exist
    created_host_paths: list[Path] = field(default_factory=list)
    netns_before: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, cp: ControlPlane, bin_dir: Path, work: Path, devices_file: Path,
              images: list[Path], timeout: float = 180.0) -> Node:
        node = cls(cp=cp, bin_dir=bin_dir, work=work, devices_file=devices_file)
        try:
            node._start(images, timeout)
        except BaseException:
            node.stop(keep_logs=True)
            raise
        return node

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- start --------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> Process:
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.work,
                                     env={**os.environ, **(env or {})},
                                     preexec_fn=die_with_parent)
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    @property
    def socket(self) -> Path:
        return self.work / "containerd" / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.work / "pod-logs"

    @property
    def root_dir(self) -> Path:
        return self.work / "kubelet"

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin_dir / "ctr"), "--address", str(self.socket),
                               "-n", K8S_NAMESPACE, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def _start(self, images: list[Path], timeout: float) -> None:
        self.created_host_paths = [p for p in FIXED_HOST_PATHS if not p.exists()]
        self.netns_before = set(os.listdir(NETNS)) if NETNS.exists() else set()
        self.kubelet_version = version_of(self.bin_dir / "kubelet", "--version").split()[-1]
        self.containerd_version = version_of(self.bin_dir / "containerd", "--version").split()[2]
        for sub in ("containerd", "cni", "cni-ipam", "cdi", "kubelet", "pod-logs",
                    "kubelet/plugins/" + DRIVER):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        for controller in _cgroup_controllers():
            (controller / CGROUP_ROOT.lstrip("/")).mkdir(exist_ok=True)
        (self.work / "containerd.toml").write_text(_containerd_config(self.work))
        (self.work / "cni" / "10-draslice.conflist").write_text(
            json.dumps(_cni_config(self.work), indent=1))
        containerd = self._spawn(
            "containerd", [str(self.bin_dir / "containerd"),
                           f"--config={self.work / 'containerd.toml'}", "--log-level=warn"],
            env={"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"})
        self._wait(containerd, "containerd's socket", self.socket.exists, timeout)
        self._wait(containerd, "containerd's CRI plugin",
                   lambda: self.ctr("version").returncode == 0, timeout)
        for image in images:
            out = self.ctr("images", "import", "--no-unpack", str(image))
            if out.returncode != 0:
                raise RuntimeError(f"ctr images import {image}: {out.stderr.strip()}")

        _bridge_with_node_address()
        crt, key = self.cp.authority.client(
            f"kubelet-{self.name}", certs.Identity(f"system:node:{self.name}",
                                                   ("system:nodes",)))
        kubeconfig = self.cp.write_kubeconfig(f"kubelet-{self.name}", cert=crt, key=key)
        config = self.work / "kubelet.yaml"
        config.write_text(yaml.safe_dump(_kubelet_config(
            self.work, f"unix://{self.socket}", self.cp.ca)))
        kubelet = self._spawn("kubelet", [
            str(self.bin_dir / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root_dir}", f"--cert-dir={self.work / 'kubelet-pki'}",
            f"--hostname-override={self.name}", f"--node-ip={NODE_IP}", "--v=1"])
        admin = self.cp.admin
        self._wait(kubelet, f"node {self.name} Ready", lambda: self.ready(), timeout)

        driver = self._spawn("dradriver", [
            str(self.bin_dir / "dradriver"), f"--kubeconfig={self.cp.admin_kubeconfig}",
            f"--node-name={self.name}", f"--devices={self.devices_file}",
            f"--driver-name={DRIVER}",
            f"--cdi-dir={self.work / 'cdi'}",
            f"--plugin-registration-path={self.root_dir / 'plugins_registry'}",
            f"--datadir={self.root_dir / 'plugins'}"])
        self._wait(driver, "the DRA driver's ResourceSlices", self._published, timeout)
        del admin

    def _published(self) -> bool:
        for line in self.processes[-1].log.read_text(errors="replace").splitlines():
            if line.startswith("dra driver "):
                self.published = line.strip()
                return True
        return False

    def ready(self) -> bool:
        try:
            node = self.cp.admin.get("Node", self.name)
        except Exception:  # noqa: BLE001 - not registered yet
            return False
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node.get("status", {}).get("conditions", []))

    def _wait(self, proc: Process, what: str, probe, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.processes:
                p.check_alive()
            if probe():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s; the end of {proc.name}'s log:\n"
                           f"{proc.tail()}")

    # --- stop ---------------------------------------------------------------------------------

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (last 40 lines) ---\n{p.tail()}" for p in self.processes)

    def stop(self, keep_logs: bool = False) -> None:
        """End the driver, the kubelet and containerd (with every container and shim it runs),
        then remove what they left: mounts, the bridge, the pods' cgroups, the folder."""
        if keep_logs and self.processes:
            print(self.logs())
        for proc in reversed(self.processes):
            if proc.name == "containerd" and proc.popen.poll() is None:
                self._kill_containers()
            if proc.popen.poll() is None:
                proc.popen.terminate()
            try:
                proc.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        self.processes.clear()
        self._kill_shims()
        _unmount_under(self.work)
        for name in (set(os.listdir(NETNS)) if NETNS.exists() else set()) - self.netns_before:
            subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "delete", BRIDGE], check=False, capture_output=True)
        for path in self.created_host_paths:
            _unmount_under(path)
            shutil.rmtree(path, ignore_errors=True)
        for controller in _cgroup_controllers():
            _remove_cgroup_tree(controller / CGROUP_ROOT.lstrip("/"))
        shutil.rmtree(self.work, ignore_errors=True)

    def _kill_containers(self) -> None:
        out = self.ctr("tasks", "list", "-q", timeout=30)
        for task in out.stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, timeout=30)

    def _kill_shims(self) -> None:
        """A shim outlives containerd by design; these belong to this node's containerd."""
        marker = str(self.work / "containerd")
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "containerd-shim-runc-v2" in cmdline and marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_dir.name), 9)
