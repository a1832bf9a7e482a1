"""Who may talk to the grading cluster: TLS certificates for Dask, and the addresses `coursekit grade` accepts.

A Dask scheduler runs what any connected client asks it to (``Client.run_on_scheduler``, ``Client.submit``), so a
scheduler that listens on a network address without authentication gives every machine on that network the
grading workers and the grader's client. So:

- a local cluster (``coursekit grade`` with no ``--scheduler``) listens on the loopback address only, and speaks
  TLS with a certificate made for that one run (``distributed.security.Security.temporary``): not even another
  user of the grading machine can connect to it;
- ``--scheduler`` takes a ``tls://`` address with the instructor's certificates (:func:`make_certs`, the command
  ``coursekit cluster-certs DIR``, or dask's own ``distributed.comm.tls`` configuration), and refuses a plain
  ``tcp://`` address unless it is a loopback one (a cluster on this machine, as the README's three-terminal trial).

Every node (scheduler, workers, the grading process) presents a certificate signed by the course's own certificate
authority and accepts only peers that do (mutual TLS, ``require_encryption``). Sources: Dask's *TLS/SSL* security
documentation (https://distributed.dask.org/en/stable/tls.html) and the ``cryptography`` package's X.509 tutorial
(https://cryptography.io/en/latest/x509/tutorial/).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from .nbenv import CourseError

CA, CERT, KEY = "ca.pem", "node.pem", "node-key.pem"  # the files make_certs writes that every node needs
CA_KEY = "ca-key.pem"  # the authority's own key: stays with the instructor, signs new node certificates
DAYS = 365


def _loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_address(scheduler: str) -> str:
    """The scheme of ``scheduler`` (``"tls"`` or ``"tcp"``) if `coursekit grade` may use it; :class:`CourseError`
    saying why not otherwise (plain TCP beyond loopback, an unknown scheme, no host)."""
    if not isinstance(scheduler, str) or "://" not in scheduler:
        raise CourseError(f"--scheduler needs an address such as tls://10.0.0.5:8786, got {scheduler!r}")
    parts = urlsplit(scheduler)
    scheme, host = parts.scheme, parts.hostname or ""
    if scheme not in ("tls", "tcp"):
        raise CourseError(f"--scheduler {scheduler}: the scheme must be tls:// (or tcp:// on this machine), not {scheme}://")
    if not host:
        raise CourseError(f"--scheduler {scheduler}: no host in the address")
    if scheme == "tcp" and not _loopback(host):
        raise CourseError(
            f"--scheduler {scheduler}: a plain tcp:// scheduler on the network lets anyone who can reach it run code on "
            "the grading workers and in this grading process. Use TLS: `coursekit cluster-certs DIR`, start the "
            "scheduler and workers with those certificates, and pass --scheduler tls://HOST:PORT --certs DIR "
            "(docs/instructors.md: A large class on a cluster). tcp:// is accepted on the loopback address only.")
    return scheme


def speaks_tls(scheduler: str, timeout: float = 5.0) -> bool:
    """Whether the server at ``scheduler``'s host and port answers a TLS handshake (a scheduler started with
    ``--protocol tls``): True when the handshake completes or the server answers it with a TLS alert (it asks for the
    client certificate the probe does not have); False when it does not speak TLS or cannot be reached. The probe
    sends no certificate and reads nothing but the handshake."""
    import socket
    import ssl

    parts = urlsplit(scheduler)
    if not parts.hostname or not parts.port:
        return False
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=parts.hostname) as tls:
                tls.recv(1)  # TLS 1.3: a server that wants a client certificate says so after the handshake
        return True
    except ssl.SSLError as e:
        return "WRONG_VERSION_NUMBER" not in str(e) and "record layer failure" not in str(e)
    except (OSError, ValueError):
        return False


def unreachable(scheduler: str, error: BaseException) -> CourseError:
    """The error to show when connecting to ``scheduler`` failed with ``error``: a ``tcp://`` address whose server
    speaks TLS is named as such, with the address to use instead."""
    if urlsplit(scheduler).scheme == "tcp" and speaks_tls(scheduler):
        tls = "tls://" + scheduler.split("://", 1)[1]
        return CourseError(f"the scheduler at {scheduler} speaks TLS (it was started with --protocol tls), so it closed "
                           f"the plain connection: use --scheduler {tls} --certs DIR, with the certificates it was "
                           f"started with (coursekit cluster-certs DIR)")
    return CourseError(f"cannot reach the Dask scheduler at {scheduler}: {error}")


def client_security(scheduler: str, certs: str | os.PathLike | None):
    """The ``distributed.security.Security`` the grading process connects with: the certificates in ``certs``
    (:func:`make_certs`'s folder), else dask's configured ``distributed.comm.tls`` settings. None for a loopback
    ``tcp://`` scheduler. :class:`CourseError` when a ``tls://`` scheduler has no certificate to use."""
    from distributed.security import Security

    if check_address(scheduler) == "tcp":
        return None
    if certs is not None:
        d = Path(certs)
        missing = [f for f in (CA, CERT, KEY) if not (d / f).is_file()]
        if missing:
            raise CourseError(f"--certs {d}: missing {', '.join(missing)} (make them with `coursekit cluster-certs {d}`)")
        return Security(tls_ca_file=str(d / CA), tls_client_cert=str(d / CERT), tls_client_key=str(d / KEY),
                        require_encryption=True)
    sec = Security(require_encryption=True)  # dask's config: distributed.comm.tls.{ca-file, client.cert, client.key}
    if not sec.tls_ca_file or not sec.tls_client_cert:
        raise CourseError(f"--scheduler {scheduler} is a TLS address but no certificate was given: pass --certs DIR "
                          "(made by `coursekit cluster-certs DIR`) or set distributed.comm.tls in dask's configuration")
    return sec


def local_security():
    """TLS for a local cluster, with a certificate made for this run only (nothing written to disk)."""
    from distributed.security import Security

    return Security.temporary()


def make_certs(folder: str | os.PathLike, days: int = DAYS) -> list[Path]:
    """Write a certificate authority and one node certificate signed by it into ``folder`` (created, mode 0700):
    :data:`CA`, :data:`CERT` and :data:`KEY` for every node, :data:`CA_KEY` for the instructor only. Refuses to
    overwrite existing files (:class:`CourseError`). Returns the paths written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = Path(folder)
    if days < 1:
        raise CourseError(f"certificates must be valid for at least one day, got {days}")
    existing = [f for f in (CA, CERT, KEY, CA_KEY) if (d / f).exists()]
    if existing:
        raise CourseError(f"{d} already holds {', '.join(existing)}; choose an empty folder")
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str):
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "coursekit grading"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("coursekit grading CA")).issuer_name(name("coursekit grading CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = (x509.CertificateBuilder().subject_name(name("coursekit grading node")).issuer_name(ca.subject)
            .public_key(node_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    private = dict(encoding=pem, format=serialization.PrivateFormat.PKCS8, encryption_algorithm=serialization.NoEncryption())
    written = []
    for fname, data, mode in ((CA, ca.public_bytes(pem), 0o644), (CERT, node.public_bytes(pem), 0o644),
                              (KEY, node_key.private_bytes(**private), 0o600),
                              (CA_KEY, ca_key.private_bytes(**private), 0o600)):
        p = d / fname
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        written.append(p)
    return written


def usage(folder: str | os.PathLike) -> str:
    """The commands that start a scheduler, workers and the grader with :func:`make_certs`'s files, with the settings
    the course's grading needs (a task whose worker died is retried once, not three times; one torch thread per
    notebook kernel), ready to paste."""
    d = Path(folder).resolve()
    tls = f"--tls-ca-file {d / CA} --tls-cert {d / CERT} --tls-key {d / KEY}"
    return (f"Copy {CA}, {CERT} and {KEY} to every grading machine (keep {CA_KEY} to yourself), then:\n"
            f"  scheduler: DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=1 dask scheduler --protocol tls "
            f"--host <its address> --port 8786 {tls}\n"
            f"  workers:   OMP_NUM_THREADS=1 dask worker tls://<scheduler address>:8786 --nthreads 1 --nworkers <cores> "
            f"{tls}\n"
            f"  grader:    coursekit grade 02 --scheduler tls://<scheduler address>:8786 --certs {d}\n"
            f"(on one machine, <its address> and <scheduler address> are 127.0.0.1)")