"""``python tests/gcs_emulator.py start ...``: gcp-storage-emulator honouring preconditions.

The emulator ignores ``ifGenerationMatch``, which real GCS enforces and the
output lock relies on (create-if-absent with 0, refresh and delete at a known
generation). This launcher wraps its object upload and delete handlers with
that check before the server builds its routing table, then starts it as
``python -m gcp_storage_emulator`` would. The server handles one request at
a time, so check-then-act here is atomic, as it is on GCS.
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

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main
    main(sys.argv[1:])
