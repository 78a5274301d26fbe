"""A Google Cloud Storage emulator for the tests (gcp-storage-emulator, in memory) that also sends
``x-goog-generation`` on object downloads, as real GCS does: TensorStore reads an object's
generation from that header before it overwrites it (orbax's OCDBT manifests), and the emulator
leaves it out.

It answers one request at a time (http.server's HTTPServer, one connection per request) and
listens with a backlog of 256 instead of socketserver's 5. gcsfs opens one connection per range
of a ``cat_ranges`` call at once (a store reader's index reads: one per shard); past a backlog
of 5 the kernel drops the extra connections' SYNs and the client resends them after a 1 s
timeout, then 3 s, ...: a 40-range read took 53 s with a backlog of 5.

    python tests/gcs_emulator.py PORT
"""

import sys
from http import server as http_server

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # not found: the handler already answered 404
        return
    response["x-goog-generation"] = obj["generation"]
    response["x-goog-metageneration"] = obj["metageneration"]


def main(port: int) -> None:
    http_server.HTTPServer.request_queue_size = 256  # this process's only server
    objects.download = download  # objects.get(alt=media) calls it by name
    server.HANDLERS = tuple(
        (pattern, {verb: download if fn is _download else fn for verb, fn in verbs.items()})
        for pattern, verbs in server.HANDLERS
    )
    server.create_server("127.0.0.1", port, in_memory=True).run()


if __name__ == "__main__":
    main(int(sys.argv[1]))
