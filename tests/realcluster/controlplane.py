"""A real Kubernetes control plane on loopback for the tests: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built from upstream's modules by
scripts/cluster/build.sh (docs/cluster-tests.md).

- Certificates are generated per run (:mod:`.certs`); the admin, the controller-manager and the
  scheduler authenticate with client certificates, service accounts with tokens the API server
  signs (TokenRequest).
- DRA (``resource.k8s.io/v1``) and MutatingAdmissionPolicy (``admissionregistration.k8s.io/v1``)
  are on by default in 1.37; ``v1beta1`` of both groups is switched on as well, so that slices
  captured from older drivers and the ``map-v1beta1`` policy go through the server's own
  conversion.
- The controller-manager runs only the controllers the tests need: the resourceclaim controller
  (claims from templates), the service-account controller (every namespace's ``default``
  account, which pod admission requires), the node-lifecycle controller (so that fake Nodes are
  Ready only while :mod:`.nodes` heartbeats them, as a kubelet would) and the namespace
  controller. With ``--use-service-account-credentials`` each runs as its own service account
  with the bootstrap RBAC role Kubernetes gives it.
- Every process dies with the Python process that started it (``PR_SET_PDEATHSIG``), and
  :meth:`ControlPlane.stop` ends them and removes their folder, on success or failure.

Use it from pytest through the ``control_plane`` fixture (tests/realcluster/conftest.py) or
directly::

    with ControlPlane.start(bin_dir, work_dir) as cp:
        cp.admin.list("Node")
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from draslice.tests.realcluster import certs
from draslice.tests.realcluster.kube import Kube, KubeError

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster" / "build.sh"
CONTROLLERS = ("resourceclaim-controller", "serviceaccount-controller",
               "node-lifecycle-controller", "namespace-controller")
RUNTIME_CONFIG = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true," \
                 "admissionregistration.k8s.io/v1beta1=true"
LOG_TAIL = 40


def build_binaries() -> Path:
    """The folder of the built control plane (built now if the cache lacks it)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, text=True,
                         stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {out.returncode}); its errors are "
                           "above")
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = LOG_TAIL) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; the end of its "
                               f"log:\n{self.tail()}")


def kubeconfig(server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
               token: str | None = None, name: str = "draslice-test") -> dict:
    user: dict = {"token": token} if token else {"client-certificate": str(cert),
                                                 "client-key": str(key)}
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server,
                                                "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


@dataclass
class ControlPlane:
    bin_dir: Path
    work: Path
    runtime_config: str = RUNTIME_CONFIG
    full: bool = True  # False: etcd and kube-apiserver only (an API server to read, no pods)
    controllers: tuple[str, ...] = CONTROLLERS
    # "Node,RBAC" where a real kubelet joins (tests/node): the Node authorizer is what lets a
    # kubelet read its own pods' secrets, claims and service-account tokens.
    authorization: str = "RBAC"
    processes: list[Process] = field(default_factory=list)
    server: str = ""
    version: str = ""

    # --- start --------------------------------------------------------------------------------

    @classmethod
    def start(cls, bin_dir: Path, work: Path, timeout: float = 120.0,
              runtime_config: str = RUNTIME_CONFIG, full: bool = True,
              controllers: tuple[str, ...] = CONTROLLERS,
              authorization: str = "RBAC") -> ControlPlane:
        cp = cls(bin_dir=bin_dir, work=work, runtime_config=runtime_config, full=full,
                 controllers=controllers, authorization=authorization)
        try:
            cp._start(timeout)
        except BaseException:
            cp.stop(keep_logs=True)
            raise
        return cp

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, name: str, *args: str) -> Process:
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen([str(self.bin_dir / name), *args], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.work, preexec_fn=die_with_parent)
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def _start(self, timeout: float) -> None:
        pki = self.work / "pki"
        pki.mkdir(parents=True)
        ca = certs.CertificateAuthority(pki)
        self.authority = ca  # issues more identities later (a kubelet's, tests/node)
        self.ca = ca.cert_path
        serving = ca.issue("apiserver", "kube-apiserver", server=True,
                           dns=("localhost", "kubernetes", "kubernetes.default",
                                "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"),
                           ips=("127.0.0.1", "10.0.0.1"))
        sa_key, sa_pub = certs.service_account_keys(pki)
        self.admin_cert = ca.client("admin", certs.ADMIN)
        # What the API server shows a kubelet when it proxies `kubectl logs` and exec to it.
        kubelet_client = ca.client("apiserver-kubelet-client", certs.APISERVER_KUBELET_CLIENT)

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd = self._spawn(
            "etcd", "--name=draslice-test", f"--data-dir={self.work / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=draslice-test=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level=warn",
        )
        self._wait_tcp(etcd, etcd_port, timeout)

        self.server = f"https://127.0.0.1:{api_port}"
        apiserver = self._spawn(
            "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}", f"--cert-dir={self.work / 'apiserver'}",
            f"--tls-cert-file={serving[0]}", f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={ca.cert_path}",
            f"--kubelet-client-certificate={kubelet_client[0]}",
            f"--kubelet-client-key={kubelet_client[1]}",
            # a node's name resolves nowhere here: dial the address the kubelet registered
            "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24", f"--authorization-mode={self.authorization}",
            f"--runtime-config={self.runtime_config}",
            # loopback cannot be advertised as the kubernetes Service endpoint: none is kept
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
        )
        self.admin = Kube(self.server, str(ca.cert_path), cert=tuple(map(str, self.admin_cert)))
        self.admin_kubeconfig = self.write_kubeconfig(
            "admin", cert=self.admin_cert[0], key=self.admin_cert[1])
        self._wait_ready(apiserver, timeout)
        self.version = self.admin.request("GET", "/version")["gitVersion"]
        if self.full:
            self._start_controllers(ca, sa_key, timeout)

    def _start_controllers(self, ca: certs.CertificateAuthority, sa_key: Path,
                           timeout: float) -> None:
        self._spawn_component(
            ca, "kube-controller-manager", certs.CONTROLLER_MANAGER,
            f"--controllers={','.join(self.controllers)}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={sa_key}", f"--root-ca-file={ca.cert_path}")
        self._spawn_component(ca, "kube-scheduler", certs.SCHEDULER)
        # Pod admission needs each namespace's default service account: the controller's work.
        self.admin.wait("the service-account controller (default/default)",
                        lambda: self._alive_and(lambda: self.admin.get(
                            "ServiceAccount", "default", "default")), timeout)

    def _spawn_component(self, ca: certs.CertificateAuthority, name: str,
                         who: certs.Identity, *args: str) -> Process:
        """A controller-manager or scheduler: its own client certificate and kubeconfig, no
        leader election, its health port on loopback."""
        crt, key = ca.client(name, who)
        config = self.write_kubeconfig(name, cert=crt, key=key)
        return self._spawn(
            name, f"--kubeconfig={config}", f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--cert-dir={self.work / name}", "--v=1", *args)

    def _alive_and(self, probe):
        for proc in self.processes:
            proc.check_alive()
        return probe()

    def _wait_tcp(self, proc: Process, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc.check_alive()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{proc.name} did not listen on {port} within {timeout:.0f} s:\n"
                           f"{proc.tail()}")

    def _wait_ready(self, proc: Process, timeout: float) -> None:
        import requests

        def ready():
            proc.check_alive()
            try:
                return self.admin.request("GET", "/readyz") is not None
            except (KubeError, requests.RequestException, ValueError):
                return False

        self.admin.wait("kube-apiserver /readyz", ready, timeout, interval=0.25)

    # --- identities ---------------------------------------------------------------------------

    def write_kubeconfig(self, stem: str, **user) -> Path:
        path = self.work / f"{stem}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.ca, **user)))
        path.chmod(0o600)
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for the service account, from the API server's TokenRequest."""
        path = Kube.path("ServiceAccount", name, namespace) + "/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds}}
        return self.admin.request("POST", path, body)["status"]["token"]

    def as_service_account(self, namespace: str, name: str) -> tuple[Kube, Path]:
        """A client and a kubeconfig file that authenticate as the service account."""
        token = self.service_account_token(namespace, name)
        config = self.write_kubeconfig(f"sa-{namespace}-{name}", token=token)
        return Kube(self.server, str(self.ca), token=token), config

    def kubectl(self, *args: str, kubeconfig: Path | None = None,
                stdin: str | None = None) -> subprocess.CompletedProcess:
        """The built kubectl against this control plane (as admin unless ``kubeconfig``)."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.admin_kubeconfig)}
        return subprocess.run([str(self.bin_dir / "kubectl"), *args], env=env, text=True,
                              input=stdin, capture_output=True, timeout=120, check=False)

    # --- stop ---------------------------------------------------------------------------------

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (last {LOG_TAIL} lines) ---\n{p.tail()}"
                         for p in self.processes)

    def stop(self, keep_logs: bool = False) -> None:
        """End every process (TERM, then KILL after 10 s) and remove the folder.

        ``keep_logs``: print the end of each log first (a failed start)."""
        if keep_logs and self.processes:
            print(self.logs())
        for proc in reversed(self.processes):
            if proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in reversed(self.processes):
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        self.processes.clear()
        shutil.rmtree(self.work, ignore_errors=True)
