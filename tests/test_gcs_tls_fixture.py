"""The gs:// test path (`tests.gcs_tls`): TensorFlow's own GCS client reaches
the local server, and the server frames request bodies as that client sends them.

Each emulator patch in `tests/gcs_emulator.py` has a test here at the
protocol level (raw HTTP to the server) and one through TensorFlow, which
also shows that TF sends what the patch is for.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid

import pytest

from tests.gcs_tls import GcsProxy, GcsTlsServer
from tests.helpers import EMULATOR_BUCKET, REPO

TF_WRITES = r"""
import json, sys
import tensorflow as tf

root, local = sys.argv[1], sys.argv[2]
records = [bytes([i % 256]) * (1000 * i) for i in range(1, 25)]  # ~300 KB: many chunks
for path in (root + "/records.tfrecord", local):
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
read = list(tf.data.TFRecordDataset(root + "/records.tfrecord").as_numpy_iterator())
tf.io.gfile.makedirs(root + "/dir/sub")
with tf.io.gfile.GFile(root + "/empty", "wb") as f:
    f.write(b"")  # GFile opens the object at its first write
with tf.io.gfile.GFile(root + "/empty", "rb") as f:
    empty = f.read()
print("RESULTS " + json.dumps({
    "read_back": read == records, "isdir": tf.io.gfile.isdir(root + "/dir/sub"),
    "listdir": sorted(tf.io.gfile.listdir(root)),
    "empty": [len(empty), tf.io.gfile.stat(root + "/empty").length]}))
"""


@pytest.fixture(scope="module")
def tf_writes(gcs_tls_server, tmp_path_factory):
    """What TensorFlow wrote and read back under a fresh prefix of the bucket."""
    prefix = f"fixture-{uuid.uuid4().hex[:8]}"
    local = tmp_path_factory.mktemp("tf-writes") / "records.tfrecord"
    proc = gcs_tls_server.run([sys.executable, "-c", TF_WRITES,
                               f"gs://{EMULATOR_BUCKET}/{prefix}", str(local)],
                              timeout=120, cwd=REPO)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return prefix, local, json.loads(lines[0][len("RESULTS "):])


def _uploads(server: GcsTlsServer, name: str):
    quoted = name.replace("/", "%2F")
    return [e for e in server.proxy.exchanges
            if "/upload/" in e.url and f"name={quoted}&" in e.url + "&"]


def _blob(server: GcsTlsServer, name: str):
    return server.emulator.client().bucket(EMULATOR_BUCKET).get_blob(name, timeout=10)


def _exchange(port: int, head: str, body_parts=(b"",),
              expect_interim=False) -> tuple[bytes, bytes]:
    """Sends ``head`` then ``body_parts`` to the server; returns (interim, final) responses.

    With ``expect_interim`` the body waits for the server's first answer,
    as a client sending ``Expect: 100-continue`` does.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        interim = sock.recv(65536) if expect_interim else b""
        for part in body_parts:
            sock.sendall(part)
        final = b""
        while chunk := sock.recv(65536):
            final += chunk
    return interim, final


def _media_head(port: int, name: str, *headers: str) -> str:
    return "\n".join([f"POST /upload/storage/v1/b/{EMULATOR_BUCKET}/o?uploadType=media"
                      f"&name={name.replace('/', '%2F')} HTTP/1.1", f"Host: 127.0.0.1:{port}",
                      "Content-Type: application/octet-stream", *headers, ""])


def test_chunked_body_with_content_length_is_stored_without_its_framing(gcs_tls):
    name = f"raw-{uuid.uuid4().hex[:8]}/chunked"
    port = gcs_tls.emulator.port
    _, final = _exchange(port, _media_head(port, name, "Transfer-Encoding: chunked",
                                           "Content-Length: 11"),
                         [b"5;ext=1\r\nhello\r\n", b"6\r\n world\r\n", b"0\r\n\r\n"])
    assert final.startswith(b"HTTP/1.0 200 ")
    assert gcs_tls.emulator.download(name) == b"hello world"


def test_tensorflow_tfrecord_upload_round_trips_byte_exact(gcs_tls, tf_writes):
    prefix, local, results = tf_writes
    name = f"{prefix}/records.tfrecord"
    puts = [e for e in _uploads(gcs_tls, name) if e.method == "PUT"]
    assert puts and all(e.headers.get("transfer-encoding") == "chunked"
                        and "content-length" in e.headers for e in puts)
    assert gcs_tls.emulator.download(name) == local.read_bytes()
    assert results["read_back"]


def test_zero_byte_upload_stores_an_empty_object(gcs_tls):
    name = f"raw-{uuid.uuid4().hex[:8]}/marker/"
    port = gcs_tls.emulator.port
    _, final = _exchange(port, _media_head(port, name, "Content-Length: 0"))
    assert final.startswith(b"HTTP/1.0 200 ")
    assert _blob(gcs_tls, name).size == 0


def test_tensorflow_directory_markers_and_empty_files(gcs_tls, tf_writes):
    prefix, _, results = tf_writes
    for name in (f"{prefix}/dir/", f"{prefix}/dir/sub/", f"{prefix}/empty"):
        uploads = _uploads(gcs_tls, name)
        assert uploads and _blob(gcs_tls, name).size == 0, name
    assert results["isdir"] and results["empty"] == [0, 0]
    assert results["listdir"] == ["dir/", "empty", "records.tfrecord"]


def test_expect_100_continue_is_answered_before_the_body(gcs_tls):
    name = f"raw-{uuid.uuid4().hex[:8]}/expect"
    port = gcs_tls.emulator.port
    interim, final = _exchange(  # a server that waits for the body times out here
        port, _media_head(port, name, "Content-Length: 5", "Expect: 100-continue"),
        [b"hello"], expect_interim=True)
    assert interim == b"HTTP/1.0 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.0 200 ")
    assert gcs_tls.emulator.download(name) == b"hello"


def test_tensorflow_uploads_get_100_continue(gcs_tls, tf_writes):
    prefix, _, _ = tf_writes
    uploads = [e for name in ("records.tfrecord", "dir/", "empty")
               for e in _uploads(gcs_tls, f"{prefix}/{name}")]
    assert uploads and all(e.headers.get("expect") == "100-continue" for e in uploads)
    assert {e.first_status for e in uploads} == {"HTTP/1.0 100 Continue"}


def test_tensorflow_reaches_only_the_storage_endpoints_over_tls(gcs_tls, tf_writes):
    prefix, _, _ = tf_writes
    mine = [e for e in gcs_tls.proxy.exchanges if prefix in e.url]
    hosts = {e.url.split("/", 3)[2] for e in mine}
    assert hosts == {"www.googleapis.com", "storage.googleapis.com"}
    # Only the resumable-upload URL the server hands back is plain http.
    assert all(e.url.startswith("https://") or "upload_id=" in e.url for e in mine)


def test_proxy_refuses_other_hosts(tmp_path):
    from tests.gcs_tls import write_certificates
    _, cert, key = write_certificates(tmp_path)
    proxy = GcsProxy(upstream_port=1, cert=cert, key=key)  # never reached
    proxy.start()
    try:
        for line in ("CONNECT example.com:443 HTTP/1.1", "CONNECT www.googleapis.com:80 HTTP/1.1",
                     "GET http://metadata.google.internal/ HTTP/1.1"):
            _, final = _exchange(proxy.port, f"{line}\nHost: x\n")
            assert final.startswith(b"HTTP/1.1 403 "), line
    finally:
        proxy.stop()
    assert proxy.refused == ["CONNECT example.com:443 HTTP/1.1",
                             "CONNECT www.googleapis.com:80 HTTP/1.1",
                             "GET http://metadata.google.internal/ HTTP/1.1"]
    assert proxy.exchanges == []


def test_run_stops_a_command_when_the_server_logs_a_handler_exception(tmp_path):
    server = GcsTlsServer(tmp_path)
    server.start()
    try:
        # A bucket insert without a body fails inside the emulator's handler.
        crash = ("import os, time, urllib.request as u\n"
                 "try: u.urlopen(u.Request(os.environ['STORAGE_EMULATOR_HOST']"
                 " + '/storage/v1/b', data=b'', method='POST'))\n"
                 "except OSError: pass\n"
                 "time.sleep(120)\n")
        started = time.monotonic()
        with pytest.raises(AssertionError, match="server error:\n.*running the handler"):
            server.run([sys.executable, "-c", crash], timeout=100)
        # A hang bound, not a speed bar: under a second on a quiet machine;
        # left running, the command would reach its own timeout (100 s).
        assert time.monotonic() - started < 60
    finally:
        server.stop()


def test_run_stops_a_command_at_its_timeout(gcs_tls):
    with pytest.raises(AssertionError, match="no exit after 0.5 s"):
        gcs_tls.run([sys.executable, "-c", "import time; time.sleep(120)"], timeout=0.5)


BROKEN_PIPE = """----------------------------------------
Exception occurred during processing of request from ('127.0.0.1', 40000)
Traceback (most recent call last):
  File "/usr/lib/python3.11/socketserver.py", line 834, in write
    self._sock.sendall(b)
BrokenPipeError: [Errno 32] Broken pipe
----------------------------------------
"""
HANDLER_BUG = """Traceback (most recent call last):
  File "server.py", line 1, in handle
KeyError: 'bucket'
"""


def test_a_killed_clients_broken_pipe_is_forgiven_only_when_expected(tmp_path):
    server = GcsTlsServer(tmp_path)  # not started: its log is written here
    server.log_path.write_text(BROKEN_PIPE)
    assert server.server_errors()[0] == "Traceback (most recent call last):"
    server.expect_killed_clients()
    assert server.server_errors() == []
    server.log_path.write_text(BROKEN_PIPE + HANDLER_BUG)
    assert server.server_errors()[-1] == "KeyError: 'bucket'"
    server.mark_log()
    with server.log_path.open("a") as log:
        log.write(BROKEN_PIPE)
    assert "BrokenPipeError: [Errno 32] Broken pipe" in server.server_errors()  # ended


def test_a_broken_pipe_still_being_written_is_judged_once_whole(tmp_path):
    """The server writes a traceback line by line: read before its exception
    line (a client killed a moment ago), it is neither forgiven nor blamed
    yet; waited for, it is judged whole; never finished, it is an error."""
    server = GcsTlsServer(tmp_path)  # not started: its log is written here
    server.expect_killed_clients()
    unfinished = BROKEN_PIPE[:BROKEN_PIPE.index("BrokenPipeError")]
    server.log_path.write_text(unfinished + "BrokenPi")  # mid-line, too
    assert server.server_errors() == []  # decided at the next look
    finish = threading.Timer(0.3, lambda: server.log_path.write_text(BROKEN_PIPE))
    finish.start()
    assert server.server_errors(settle=10) == []
    server.log_path.write_text(BROKEN_PIPE + HANDLER_BUG[:-len("KeyError: 'bucket'\n")])
    assert server.server_errors() == []
    assert server.server_errors(settle=0.2)[0] == "Traceback (most recent call last):"
