"""The certificates and keys of a test control plane, made with ``cryptography``.

One CA signs the API server's serving certificate (loopback and the in-cluster names) and a
client certificate per identity: the admin in ``system:masters``, and the controller-manager
and scheduler as the users Kubernetes' bootstrap RBAC already binds
(``system:kube-controller-manager``, ``system:kube-scheduler``), so those two run with their
real, least-privilege roles. A separate RSA key signs service-account tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Identity:
    """A client certificate's subject: the user (CN) and its groups (O)."""

    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("draslice-test-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")
APISERVER_KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client", ("system:masters",))


def _write_key(path: Path, key) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common)])


class CertificateAuthority:
    """A CA in ``folder``; :meth:`issue` writes ``<stem>.crt`` and ``<stem>.key`` there."""

    def __init__(self, folder: Path):
        self.folder = folder
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = _name("draslice-test-ca")
        self.cert = (
            x509.CertificateBuilder().subject_name(self._subject).issuer_name(self._subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = folder / "ca.crt"
        _write_cert(self.cert_path, self.cert)

    def issue(self, stem: str, common: str, orgs: tuple[str, ...] = (), *, server: bool = False,
              dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> tuple[Path, Path]:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder().subject_name(_name(common, orgs))
            .issuer_name(self._subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if dns or ips:
            names = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        crt, pem = self.folder / f"{stem}.crt", self.folder / f"{stem}.key"
        _write_cert(crt, cert)
        _write_key(pem, key)
        return crt, pem

    def client(self, stem: str, who: Identity) -> tuple[Path, Path]:
        return self.issue(stem, who.user, who.groups)


def service_account_keys(folder: Path) -> tuple[Path, Path]:
    """The key pair that signs (private) and verifies (public) service-account tokens."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = folder / "sa.key", folder / "sa.pub"
    _write_key(private, key)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public
