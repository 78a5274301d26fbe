"""A Google Cloud Storage emulator for the tests (gcp-storage-emulator, in memory) that also sends
``x-goog-generation`` on object downloads, as real GCS does: TensorStore reads an object's
generation from that header before it overwrites it (orbax's OCDBT manifests), and the emulator
leaves it out.

    python tests/gcs_emulator.py PORT
"""

import sys

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
    objects.download = download  # objects.get(alt=media) calls it by name
    server.HANDLERS = tuple(
        (pattern, {verb: download if fn is _download else fn for verb, fn in verbs.items()})
        for pattern, verbs in server.HANDLERS
    )
    server.create_server("127.0.0.1", port, in_memory=True).run()


if __name__ == "__main__":
    main(int(sys.argv[1]))
