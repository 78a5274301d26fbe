"""Uploads to the local Hub (tests/hub_server.py): the endpoints huggingface_hub's real
``HfApi.create_repo``, ``upload_folder`` and ``create_commit`` call (huggingface_hub 2.4), added
to a `HubServer` as routes (`add_upload_routes`):

    POST /api/repos/create                       a repository, its first commit .gitattributes
    POST /api/validate-yaml                      a README's metadata, parsed by huggingface_hub's
                                                 own card parser (the Hub's check, in kind)
    POST /api/{type}s/{repo}/preupload/{rev}     each file's upload mode (lfs by the Hub's default
                                                 patterns or the repository's .gitattributes, and
                                                 10 MiB or more; else regular) and its current oid
    POST /{prefix}{repo}.git/info/lfs/objects/batch   Git LFS's batch API, "basic" transfer: a
                                                 PUT to /_lfs/OID, then POST /_lfs/OID/verify
    POST /api/{type}s/{repo}/commit/{rev}        the NDJSON commit (header, file in base64,
                                                 lfsFile by sha256, deletedFile), a new commit
                                                 on the branch (tests/hub_repos.py)

Writes need a token the server accepts. Git LFS is served, not Xet: a test sets
``HF_HUB_DISABLE_XET=1``, which makes the client take the LFS path it takes where hf_xet is not
installed (Xet's content-addressed store has its own protocol, not served here).
"""

import base64
import hashlib
import json
import os

from hub_repos import DEFAULT_LFS_PATTERNS, LFS_MIN_SIZE
from hub_server import API, REPO, HubError, Response

# What the Hub writes as a new repository's .gitattributes (its LFS lines).
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in DEFAULT_LFS_PATTERNS)


def _writer(server, request) -> None:
    if request.token not in server.tokens:
        raise HubError(401, None, "Invalid credentials in Authorization header")


def _create(server, request):
    _writer(server, request)
    payload = json.loads(request.body or b"{}")
    repo_type = payload.get("type") or "model"
    repo_id = f"{payload.get('organization') or 'bertjax-test'}/{payload['name']}"
    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    url = f"{server.url}/{prefix}{repo_id}"
    if server.repos.folder(repo_type, repo_id) is not None:  # the Hub's 409 names the repo too
        message = f"You already created this {repo_type} repo"
        return Response.json({"error": message, "url": url}, 409, {"X-Error-Message": message})
    private = payload.get("visibility", "public") == "private" or bool(payload.get("private"))
    server.repos.commit(
        repo_id,
        {".gitattributes": GITATTRIBUTES},
        repo_type=repo_type,
        message="initial commit",
        private=private,
    )
    return Response.json({"url": url, "name": repo_id})


def _validate_yaml(server, request):
    from huggingface_hub import RepoCard

    content = json.loads(request.body)["content"]
    try:
        card = RepoCard(content, ignore_metadata_errors=False)
        if json.loads(request.body).get("repoType", "model") == "model":
            from huggingface_hub import ModelCardData

            ModelCardData(**card.data.to_dict(), ignore_metadata_errors=False)
    except Exception as error:  # what the parser refused
        return Response.json({"errors": [{"message": str(error)}]}, 400)
    return Response.json({"errors": [], "warnings": []})


def _lfs_store(server) -> str:
    path = os.path.join(server.repos.root, ".lfs")
    os.makedirs(path, exist_ok=True)
    return path


def _is_lfs(server, folder, sha, path, size) -> bool:
    return size >= LFS_MIN_SIZE or server.repos.is_lfs(folder, sha, path, size)


def _preupload(server, request):
    _writer(server, request)
    folder = server.repository(request)
    sha = server.revision(folder, request.params["rev"])
    files = []
    for item in json.loads(request.body)["files"]:
        path, size = item["path"], int(item["size"])
        entry = None
        if server.repos.file_path(folder, sha, path):
            entry = server.repos.entry(folder, sha, path, False)
        oid = (entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]) if entry else None
        mode = "lfs" if _is_lfs(server, folder, sha, path, size) else "regular"
        files.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
    return Response.json({"files": files, "commitOid": sha})


def _lfs_batch(server, request):
    _writer(server, request)
    request.params.setdefault("type", "models")
    server.repository(request)
    payload = json.loads(request.body)
    if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", []):
        raise HubError(400, None, "only basic uploads are served here")
    objects = []
    for item in payload["objects"]:
        oid, size = item["oid"], int(item["size"])
        stored = os.path.join(_lfs_store(server), oid)
        entry = {"oid": oid, "size": size, "authenticated": True}
        if not os.path.exists(stored):
            entry["actions"] = {
                "upload": {"href": f"{server.url}/_lfs/{oid}"},
                "verify": {"href": f"{server.url}/_lfs/{oid}/verify"},
            }
        objects.append(entry)
    return Response.json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})


def _lfs_put(server, request):
    oid = request.params["oid"]
    if hashlib.sha256(request.body).hexdigest() != oid:
        raise HubError(400, None, f"the uploaded bytes do not hash to {oid}")
    stored = os.path.join(_lfs_store(server), oid)
    with open(stored + ".tmp", "wb") as f:
        f.write(request.body)
    os.replace(stored + ".tmp", stored)
    return Response(200)


def _lfs_verify(server, request):
    stored = os.path.join(_lfs_store(server), request.params["oid"])
    size = json.loads(request.body)["size"]
    if not os.path.exists(stored) or os.path.getsize(stored) != size:
        raise HubError(404, None, "object not uploaded")
    return Response.json({})


def _commit(server, request):
    _writer(server, request)
    folder = server.repository(request)
    branch = request.params["rev"]
    parent = server.revision(folder, branch)
    lines = [json.loads(line) for line in request.body.splitlines() if line.strip()]
    header = lines[0]["value"] if lines and lines[0]["key"] == "header" else None
    if header is None:
        raise HubError(400, None, "a commit starts with its header")
    if header.get("parentCommit") not in (None, parent):
        raise HubError(412, None, "A commit has happened since. Please refresh and try again.")
    files = {}
    for line in lines[1:]:
        key, value = line["key"], line["value"]
        if key == "file":
            files[value["path"]] = base64.b64decode(value["content"])
        elif key == "lfsFile":
            stored = os.path.join(_lfs_store(server), value["oid"])
            if not os.path.exists(stored):
                raise HubError(400, None, f"LFS object {value['oid']} was never uploaded")
            with open(stored, "rb") as f:
                files[value["path"]] = f.read()
        elif key == "deletedFile":
            files[value["path"]] = None
        else:
            raise HubError(400, None, f"commit operation {key!r} is not served here")
    repo_type = request.params["type"].rstrip("s")
    sha = server.repos.commit(
        request.params["repo"], files, repo_type=repo_type, branch=branch, message=header["summary"]
    )
    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    url = f"{server.url}/{prefix}{request.params['repo']}/commit/{sha}"
    return Response.json({"success": True, "commitOid": sha, "commitUrl": url})


def add_upload_routes(server) -> None:
    """Serve the upload endpoints (module docstring) on ``server``."""
    server.route("POST", "create-repo", r"^/api/repos/create$", _create)
    server.route("POST", "validate-yaml", r"^/api/validate-yaml$", _validate_yaml)
    server.route("POST", "preupload", API + r"/preupload/(?P<rev>[^/]+)$", _preupload)
    server.route("POST", "commit", API + r"/commit/(?P<rev>[^/]+)$", _commit)
    server.route(
        "POST",
        "lfs-batch",
        r"^/(?:(?P<type>datasets|spaces)/)?" + REPO + r"\.git/info/lfs/objects/batch$",
        _lfs_batch,
    )
    server.route("PUT", "lfs-upload", r"^/_lfs/(?P<oid>[0-9a-f]{64})$", _lfs_put)
    server.route("POST", "lfs-verify", r"^/_lfs/(?P<oid>[0-9a-f]{64})/verify$", _lfs_verify)
