"""TensorFlow's own gs:// client against the local GCS API server, offline.

TensorFlow's GCS filesystem (libcurl inside TF, not google-cloud-storage) has
its endpoints built in: ``https://www.googleapis.com/storage/v1/``,
``https://www.googleapis.com/upload/storage/v1/`` and
``https://storage.googleapis.com/``. Its libcurl honours ``https_proxy`` and
``http_proxy``, so `GcsProxy` stands in for those hosts: it answers
``CONNECT`` for them only, terminates TLS with a certificate from a
throw-away CA (`write_certificates`; TF trusts it through ``CURL_CA_BUNDLE``)
and passes each request to the emulator. The resumable-upload URL the
emulator hands back is plain ``http://www.googleapis.com/...``; that request
reaches the proxy with an absolute URI, which it turns back into a path.

Everything listens on 127.0.0.1 on ports picked at run time; nothing needs
root or a host-name change, and a host other than the three is refused (and
recorded, so a test can fail on it) instead of being reached.
"""

from __future__ import annotations

import datetime
import os
import select
import signal
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import GcsEmulator, free_port

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
IDLE_SECONDS = 60  # a relay with no traffic either way for this long is dropped


def write_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for `GOOGLE_HOSTS` signed by it, valid one day.

    Returns (CA certificate, server certificate, server key) PEM paths. A
    fresh CA per run keeps the key nowhere but the test's temporary folder.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject, issuer, public_key, signing_key, extensions):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gs:// test CA")])
    ca = build(ca_name, ca_name, ca_key.public_key(), ca_key,
               [(x509.BasicConstraints(ca=True, path_length=0), True)])
    server = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]),
                   ca_name, key.public_key(), ca_key,
                   [(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), False),
                    (x509.BasicConstraints(ca=False, path_length=None), True)])
    paths = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@dataclass
class Exchange:
    """One request as the proxy passed it on, and the first status line it got back."""

    method: str
    url: str  # scheme://host/path?query as the client meant it
    headers: dict[str, str]  # lower-cased names
    first_status: str = ""  # e.g. "HTTP/1.0 100 Continue" before the final response


@dataclass
class GcsProxy:
    """A forward proxy for `GOOGLE_HOSTS` whose only upstream is the emulator."""

    upstream_port: int
    cert: Path
    key: Path
    exchanges: list[Exchange] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # request lines for other hosts

    def start(self) -> None:
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(self.cert, self.key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="gcs-proxy").start()

    def stop(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            head, rest = _read_head(client)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                if not self._allowed(host, port == "443", head):
                    return client.sendall(b"HTTP/1.1 403 Forbidden\r\n\r\n")
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                client = self._tls.wrap_socket(client, server_side=True)
                head, rest = _read_head(client)
                self._forward(client, head, rest, "https://" + host)
            elif target.startswith("http://"):
                host = target[len("http://"):].split("/", 1)[0]
                if not self._allowed(host, True, head):
                    return client.sendall(b"HTTP/1.1 403 Forbidden\r\n\r\n")
                self._forward(client, head.replace(f"http://{host}".encode(), b"", 1), rest,
                              "http://" + host)
            else:
                self._allowed("", False, head)
                client.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        except (OSError, ValueError):
            pass  # the client went away or spoke something else; it sees the error itself
        finally:
            client.close()

    def _allowed(self, host: str, port_ok: bool, head: bytes) -> bool:
        if host in GOOGLE_HOSTS and port_ok:
            return True
        with self._lock:
            self.refused.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
        return False

    def _forward(self, client, head: bytes, rest: bytes, origin: str) -> None:
        """Sends one request to the emulator and relays both ways until it closes.

        The emulator speaks HTTP/1.0 and closes after each response, which
        ends the exchange; the client then opens a new connection.
        """
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ")
        headers = dict((k.strip().lower(), v.strip()) for k, _, v in
                       (line.partition(":") for line in lines[1:] if line))
        exchange = Exchange(method, origin + path, headers)
        with self._lock:
            self.exchanges.append(exchange)
        with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
            upstream.sendall(head + rest)
            _relay(client, upstream, exchange)


def _read_head(sock) -> tuple[bytes, bytes]:
    """The request head (through the blank line) and whatever body bytes came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("connection closed before a request head")
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def _relay(client, upstream: socket.socket, exchange: Exchange) -> None:
    """Copies bytes both ways in one thread (an SSL socket is not safe to read
    and write from two threads) until either side closes or goes idle."""
    peers = {client: upstream, upstream: client}
    while True:
        ready = [client] if getattr(client, "pending", lambda: 0)() else []
        ready = ready or select.select(list(peers), [], [], IDLE_SECONDS)[0]
        if not ready:
            return
        for sock in ready:
            data = sock.recv(65536)
            if not data:
                return
            if sock is upstream and not exchange.first_status:
                exchange.first_status = data.split(b"\r\n", 1)[0].decode("latin-1")
            peers[sock].sendall(data)


# What the emulator's log shows when a handler raised (the router logs the
# first, socketserver prints the traceback); TF would answer with retries.
HANDLER_FAILURES = ("An error has occurred while running the handler",
                    "Traceback (most recent call last)")
CLIENT_GONE = ("BrokenPipeError", "ConnectionResetError")  # its client was killed
POLL_SECONDS = 0.2


def traceback_end(lines: list[str], at: int) -> int | None:
    """The index of the exception line of the traceback starting at
    ``lines[at]``; None while the server is still writing it."""
    return next((j for j in range(at + 1, len(lines)) if not lines[j].startswith(" ")), None)


def read_log(path: Path, settle: float = 0.0) -> list[str]:
    """The server log's complete lines (not one still being written). With
    ``settle``, waits up to that many seconds for a traceback the server is
    still writing (a client killed a moment ago) to get its exception line."""
    deadline = time.monotonic() + settle
    while True:
        text = path.read_text(errors="replace")
        lines = text[:text.rfind("\n") + 1].splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
        if (not starts or traceback_end(lines, starts[-1]) is not None
                or time.monotonic() > deadline):
            return lines
        time.sleep(0.05)


class GcsTlsServer:
    """The emulator, `GcsProxy` and the environment that sends TensorFlow's
    gs:// client (and google-cloud-storage) to them, for subprocesses only."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.log_path = folder / "emulator.log"
        self.log_start = 0  # the server's log lines of earlier tests end here
        self.clients_killed = False  # `expect_killed_clients` until `mark_log`
        self.emulator = GcsEmulator(free_port(), log_path=self.log_path)
        self.ca, cert, key = write_certificates(folder)
        self.proxy = GcsProxy(self.emulator.port, cert, key)

    def start(self) -> None:
        self.emulator.start()
        self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()
        self.emulator.stop()

    def env(self) -> dict[str, str]:
        """``os.environ`` plus the variables that point both GCS clients here.

        TF's retry and timeout settings are cut from minutes to seconds, so a
        request the server cannot answer fails the command instead of
        stalling it.
        """
        env = {k: v for k, v in os.environ.items()
               if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "NO_PROXY", "no_proxy",
                            "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "all_proxy")}
        proxy = f"http://127.0.0.1:{self.proxy.port}"
        env.update({
            "https_proxy": proxy, "http_proxy": proxy,
            # google-cloud-storage goes to STORAGE_EMULATOR_HOST directly.
            "no_proxy": "127.0.0.1,localhost",
            "STORAGE_EMULATOR_HOST": self.emulator.host,
            "CURL_CA_BUNDLE": str(self.ca),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",  # TF sends it, asks no one
            "NO_GCE_CHECK": "true",  # and does not look for a metadata server
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
            "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000",
            "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "10",
            "GCS_REQUEST_IDLE_TIMEOUT_SECS": "30",
            "GCS_METADATA_REQUEST_TIMEOUT_SECS": "30",
            "GCS_READ_REQUEST_TIMEOUT_SECS": "60",
            "GCS_WRITE_REQUEST_TIMEOUT_SECS": "60",
        })
        return env

    def mark_log(self) -> None:
        """What the server logged so far belongs to earlier tests (the server
        lives for the session; a test that kills clients mid-request leaves
        broken pipes in its log)."""
        self.log_start = len(read_log(self.log_path))
        self.clients_killed = False

    def expect_killed_clients(self) -> None:
        """Until the next `mark_log`, a handler that failed only because its
        client went away (a test killed it mid-request) is not a server error."""
        self.clients_killed = True

    def server_errors(self, settle: float = 0.0) -> list[str]:
        """The first handler exception in the server's log since `mark_log`
        and the 40 lines from there (its traceback); [] while there is none.

        A traceback still being written while clients are expected to be
        killed is decided once it is whole (``settle``: how long to wait).
        """
        lines = read_log(self.log_path, settle)[self.log_start:]
        for i, line in enumerate(lines):
            if not any(marker in line for marker in HANDLER_FAILURES):
                continue
            if self.clients_killed and line.startswith("Traceback"):
                end = traceback_end(lines, i)
                if end is None and not settle:
                    break  # still being written: decided at the next look
                if end is not None and lines[end].startswith(CLIENT_GONE):
                    continue
            return lines[i:i + 40]
        return []

    def run(self, args: list[str], timeout: float, extra_env: dict[str, str] | None = None,
            **popen) -> subprocess.CompletedProcess:
        """Runs ``args`` with `env` (updated with ``extra_env``); kills it and
        fails as soon as the server logs a handler exception, or when
        ``timeout`` seconds have passed."""
        # Its own process group, so that what it started goes down with it.
        proc = subprocess.Popen(args, env={**self.env(), **(extra_env or {})},
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                **popen)
        outputs = _collect(proc)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            errors = self.server_errors()
            problem = ("server error:\n" + "\n".join(errors) if errors else
                       f"no exit after {timeout} s" if time.monotonic() > deadline else "")
            if problem:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                out, err = outputs()
                raise AssertionError(f"{' '.join(args)}: {problem}\n{out[-2000:]}\n{err[-4000:]}")
            time.sleep(POLL_SECONDS)
        out, err = outputs()
        return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _collect(proc: subprocess.Popen):
    """Reads the pipes in threads (so a chatty child never blocks on a full
    pipe); the returned function waits for them and gives (stdout, stderr)."""
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=stream, k=key: chunks[k].extend(s), daemon=True)
               for key, stream in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()

    def outputs() -> tuple[str, str]:
        for reader in readers:
            reader.join()
        return "".join(chunks["out"]), "".join(chunks["err"])
    return outputs
