"""Make the certificates of the compose stack's mutual TLS between the flow runs and Dask (infra/compose.yaml).

    python infra/make_tls.py            # writes infra/tls/{ca,cert,key}.pem (git-ignored), once per install

The Dask scheduler, its workers and the Prefect worker (which runs the flows, i.e. the Dask client) all mount
infra/tls/ read-only and present the same certificate, signed by a CA made here: every connection is encrypted
and authenticated both ways. Private record batches, the identity key inside the pass-1 spec and the exact
statistics before noise cross these connections, so they never travel as plain tcp. The key never leaves this
machine's infra/tls/ folder and is never committed. Replace these files with certificates of your own PKI for
anything but one machine.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

#: The names the stack's services reach each other by, plus the loopback for the host's own tools.
HOSTS = ("dask-scheduler", "localhost", "127.0.0.1")


def make_tls_files(folder: Path, hosts: Sequence[str] = HOSTS, days: int = 825) -> tuple[Path, Path, Path]:
    """A CA and one certificate it signed for ``hosts`` (server and client use), as ``ca.pem``, ``cert.pem`` and
    ``key.pem`` (PKCS#8, unencrypted, mode 0600) in ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "privseed Dask CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "tls",
                        help="folder for ca.pem, cert.pem, key.pem (default: infra/tls)")
    parser.add_argument("--host", action="append", help="a name or IP the certificate is valid for (repeatable; "
                        f"default: {', '.join(HOSTS)})")
    args = parser.parse_args(argv)
    for path in make_tls_files(args.out, tuple(args.host or HOSTS)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
