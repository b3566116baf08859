"""``python tests/gcs_emulator.py start ...``: gcp-storage-emulator as GCS behaves.

The launcher patches the server, then starts it as ``python -m
gcp_storage_emulator`` would:

* ``ifGenerationMatch``, which real GCS enforces and the output lock relies
  on (create-if-absent with 0, refresh and delete at a known generation): the
  object upload and delete handlers are wrapped with that check before the
  server builds its routing table. The server handles one request at a time,
  so check-then-act here is atomic, as it is on GCS.
* Request bodies as HTTP/1.1 frames them, which TensorFlow's GCS client
  (libcurl) relies on (`tests.gcs_tls`): a body sent with both
  ``Transfer-Encoding: chunked`` and ``Content-Length`` is de-chunked
  (the transfer coding wins, RFC 9112 section 6.3) instead of stored with
  its chunk framing; an empty body is empty bytes, so a zero-byte upload (TF's
  directory markers) stores an empty object instead of failing the handler;
  and ``Expect: 100-continue`` gets its interim ``100 Continue``, which an
  HTTP/1.0 server does not send, so the client does not wait a second before
  each upload body.
"""

import sys
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def _precondition_holds(request, storage, object_id) -> bool:
    wanted = request.query.get("ifGenerationMatch")
    if not wanted:
        return True
    try:
        current = str(storage.get_file_obj(request.params["bucket_name"], object_id)
                      ["generation"])
    except NotFound:
        current = "0"
    return current == wanted[0]


def _refuse(response) -> None:
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": "Precondition Failed",
                             "errors": [{"reason": "conditionNotMet"}]}})


def _guard(handler, object_id_of):
    def guarded(request, response, storage, *args, **kwargs):
        object_id = object_id_of(request)
        if object_id is not None and not _precondition_holds(request, storage, object_id):
            return _refuse(response)
        return handler(request, response, storage, *args, **kwargs)
    return guarded


def _upload_name(request):
    if "name" in request.query:
        return request.query["name"][0]
    kind = request.query.get("uploadType", [""])[0]
    if kind == "multipart":
        return request.data["meta"].get("name")
    return None


objects.insert = _guard(objects.insert, _upload_name)
objects.delete = _guard(objects.delete, lambda request: request.params["object_id"])


def _read_chunked(stream) -> bytes:
    body = b""
    while True:
        size = int(stream.readline().split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        body += stream.read(size)
        stream.readline()  # the CRLF closing the chunk
    while stream.readline().strip():  # trailer fields up to the blank line
        pass
    return body


def _read_raw_data(request_handler):
    coding = request_handler.headers.get("Transfer-Encoding", "")
    if coding.lower() == "chunked":
        return _read_chunked(request_handler.rfile)
    length = request_handler.headers.get("Content-Length")
    return request_handler.rfile.read(int(length)) if length else b""


def _answer_expect(handler, parsed: bool) -> bool:
    if (parsed and handler.request_version >= "HTTP/1.1"
            and handler.headers.get("Expect", "").lower() == "100-continue"):
        handler.send_response_only(HTTPStatus.CONTINUE)
        handler.end_headers()
    return parsed


def _patch_server() -> None:
    """Imported here, after the handlers above are wrapped: the server module
    builds its routing table from them at import."""
    from gcp_storage_emulator import server
    stock_read_data, stock_parse = server._read_data, server.RequestHandler.parse_request
    server._read_raw_data = _read_raw_data
    server._read_data = lambda handler, query: (
        b"" if (data := stock_read_data(handler, query)) is None else data)
    server.RequestHandler.parse_request = lambda handler: _answer_expect(
        handler, stock_parse(handler))


_patch_server()

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main
    main(sys.argv[1:])
