"""A Hugging Face Hub on the loopback for the tests: the endpoints huggingface_hub's real client
calls (``HfApi`` repo info, tree listing with pagination, paths-info, refs, commits, whoami;
``resolve/REV/PATH`` with byte ranges, and Git LFS files through a 302 to a "CDN" on another
origin, as the Hub does), answered from a folder in the Hub's layout (tests/hub_repos.py: the
cache's ``datasets--OWNER--NAME/refs|snapshots`` folders, branches, tags and commit SHAs, models
and datasets), with every request counted and faults injected on chosen requests (429 with the
Hub's ``RateLimit`` header or ``Retry-After``, 5xx, a delay).

    server = HubServer(root)            # or the ``hub`` fixture (conftest.py), which also points
    sha = server.commit("o/corpus", {"data/a.jsonl": b"..."})   # huggingface_hub at it
    with server, use_endpoint(server.url, hf_home):
        HfApi().dataset_info("o/corpus", revision="main").sha == sha
    server.count("tree")                # tree pages served
    server.fail("resolve", 429, times=3, ratelimit_reset=0)

Extensions (an upload, a commit endpoint) add a route: ``server.route("POST", "commit",
r"^/api/(?P<type>models|datasets)/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)$", handler)``;
a handler takes (server, request) and returns `Response` or raises `HubError`.

Pointing a process at it: huggingface_hub reads ``HF_ENDPOINT`` (and ``HF_HOME``, ``HF_TOKEN``'s
file, ``HF_HUB_OFFLINE``) once, when ``huggingface_hub.constants`` is imported. A child process
gets them from its environment; `use_endpoint` sets the environment and re-reads that module in
this process (configuration, as a fresh process would read it; the client is untouched). Objects
made before keep the endpoint they were made with: ``huggingface_hub.hf_api.api`` (behind the
module-level shortcuts such as ``huggingface_hub.dataset_info``) is pointed at it too; make your
own ``HfApi()``/``HfFileSystem()`` after entering.

    python tests/hub_server.py ROOT [PORT]     # serve a folder by hand
"""

import contextlib
import dataclasses
import importlib
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from http import server as http_server

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_repos import HubRepos, folder_name  # noqa: E402

TOKEN = "hf_bertjax_test_token"  # the token the server accepts unless told others
CDN_HOST = "localhost"  # the loopback under another name: another origin, as the Hub's CDN is
REPO = r"(?P<repo>[^/]+/[^/]+)"
API = r"^/api/(?P<type>models|datasets|spaces)/" + REPO
RESOLVE = r"^/(?:(?P<type>datasets|spaces)/)?" + REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"


class HubError(Exception):
    """An error answer: status, the Hub's X-Error-Code and a message."""

    def __init__(self, status: int, code: str | None, message: str, headers=None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, dict(headers or {})


@dataclasses.dataclass
class Request:
    method: str
    kind: str  # the route: info, tree, paths-info, refs, commits, resolve, cdn, whoami, other
    path: str  # unquoted, without the query
    query: dict  # name -> list of values
    headers: dict  # lower-case names
    body: bytes = b""
    params: dict = dataclasses.field(default_factory=dict)  # the route's named groups, unquoted
    status: int | None = None  # what was answered
    fault: bool = False  # answered by an injected fault

    @property
    def token(self) -> str | None:
        value = self.headers.get("authorization", "")
        return value[7:] if value.lower().startswith("bearer ") else None


@dataclasses.dataclass
class Response:
    status: int = 200
    headers: dict = dataclasses.field(default_factory=dict)
    body: bytes = b""

    @classmethod
    def json(cls, value, status=200, headers=None):
        body = json.dumps(value).encode()
        return cls(status, {"Content-Type": "application/json", **(headers or {})}, body)


@dataclasses.dataclass
class Fault:
    """Answer ``status`` to the requests of ``kind`` (None: any) whose path matches ``match``,
    after letting ``skip`` of them through, ``times`` times (None: always)."""

    kind: str | None
    status: int
    times: int | None = 1
    skip: int = 0
    match: str | None = None
    method: str | None = None
    headers: dict = dataclasses.field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (a fault with status 0 only delays)
    seen: int = 0  # matching requests so far
    hits: int = 0  # answered by this fault

    def fires(self, request: Request) -> bool:
        if self.kind not in (None, request.kind) or self.method not in (None, request.method):
            return False
        if self.match is not None and not re.search(self.match, request.path):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.hits >= self.times):
            return False
        self.hits += 1
        return True


class HubServer:
    """The local Hub: ``url`` (the endpoint), ``repos`` (the folder), ``requests`` (the log)."""

    def __init__(
        self,
        root,
        *,
        page_size: int = 1000,
        tokens=(TOKEN,),
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.repos = HubRepos(root)
        self.page_size = page_size  # tree entries a page (the Hub: 1000; 50 with expand)
        self.tokens = set(tokens)  # tokens that may read private and gated repositories
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.routes = list(ROUTES)
        self._lock = threading.Lock()
        self._http = http_server.ThreadingHTTPServer((host, port), _Handler)
        self._http.daemon_threads = True
        self._http.block_on_close = False
        self._http.hub = self
        self.port = self._http.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.cdn_url = f"http://{CDN_HOST}:{self.port}"
        self._thread = None

    # ---- life ----

    def start(self):
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- content (tests/hub_repos.py) ----

    def commit(self, repo_id, files, **kwargs) -> str:
        return self.repos.commit(repo_id, files, **kwargs)

    def tag(self, repo_id, tag, revision, **kwargs) -> str:
        return self.repos.tag(repo_id, tag, revision, **kwargs)

    # ---- counting and faults ----

    def count(self, *kinds, method=None, match=None, status=None) -> int:
        """Requests served of these kinds (all when none named)."""
        with self._lock:
            return sum(
                (not kinds or r.kind in kinds)
                and method in (None, r.method)
                and status in (None, r.status)
                and (match is None or re.search(match, r.path) is not None)
                for r in self.requests
            )

    def reset(self):
        """Forget the requests seen and the faults set."""
        with self._lock:
            self.requests.clear()
            self.faults.clear()

    def fail(
        self,
        kind,
        status,
        *,
        times=1,
        skip=0,
        match=None,
        method=None,
        ratelimit_reset=None,
        retry_after=None,
        delay=0.0,
        headers=None,
    ) -> Fault:
        """Inject a fault (see `Fault`). ``ratelimit_reset``: a 429's ``RateLimit`` header says the
        window resets in that many seconds (the Hub's ``"api";r=0;t=N``); ``retry_after``: a
        ``Retry-After`` header."""
        headers = dict(headers or {})
        if ratelimit_reset is not None:
            headers["RateLimit"] = f'"api";r=0;t={int(ratelimit_reset)}'
            headers["RateLimit-Policy"] = '"fixed window";"api";q=1000;w=300'
        if retry_after is not None:
            headers["Retry-After"] = str(int(retry_after))
        fault = Fault(kind, status, times, skip, match, method, headers, delay)
        with self._lock:
            self.faults.append(fault)
        return fault

    def route(self, methods, kind, pattern, handler):
        """Serve ``pattern`` (a regex on the raw path) with ``handler(server, request)``, before
        the built-in routes."""
        methods = (methods,) if isinstance(methods, str) else tuple(methods)
        self.routes.insert(0, (methods, kind, re.compile(pattern), handler))

    # ---- what handlers share ----

    def repository(self, request: Request, files: bool = False) -> str:
        """The folder of the request's repository, after the Hub's access checks: a private one
        needs a token, a gated one's files need a token that was granted access."""
        repo_type, repo_id = request.params["type"].rstrip("s"), request.params["repo"]
        folder = self.repos.folder(repo_type, repo_id)
        settings = self.repos.settings(folder) if folder else {}
        allowed = request.token in self.tokens
        if folder is None or (settings.get("private") and not allowed):
            status = 404 if allowed else 401
            raise HubError(status, "RepoNotFound", f"Repository not found: {repo_id}")
        if files and settings.get("gated") and not allowed:
            status = 403 if request.token else 401
            raise HubError(status, "GatedRepo", f"Access to {repo_type} {repo_id} is restricted")
        return folder

    def revision(self, folder: str, revision: str) -> str:
        sha = self.repos.resolve(folder, revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def dispatch(self, method, raw_path, headers, body) -> tuple[Request, Response]:
        parsed = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        request = Request(method, "other", urllib.parse.unquote(parsed.path), query, headers, body)
        handler = None
        for methods, kind, pattern, fn in self.routes:
            found = pattern.match(parsed.path)
            if found and method in methods:
                params = {k: urllib.parse.unquote(v) for k, v in found.groupdict().items() if v}
                request.kind, request.params, handler = kind, params, fn
                break
        with self._lock:
            self.requests.append(request)
            fault = next((f for f in self.faults if f.fires(request)), None)
        if fault is not None:
            time.sleep(fault.delay)
        if fault is not None and fault.status:
            request.fault = True
            message = {"error": f"injected {fault.status}"}
            response = Response.json(message, fault.status, fault.headers)
        elif handler is None:
            response = Response.json({"error": "Not Found"}, 404)
        else:
            try:
                response = handler(self, request)
            except HubError as e:
                headers = {"X-Error-Code": e.code, "X-Error-Message": str(e), **e.headers}
                response = Response.json({"error": str(e)}, e.status, headers)
        request.status = response.status
        return request, response


class _Handler(http_server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub's clients expect
    timeout = 60

    def log_message(self, *args):  # quiet
        pass

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        _, response = self.server.hub.dispatch(self.command, self.path, headers, body)
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if "Content-Length" not in response.headers:
            self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve


# ---- the routes ----


def _info(server, request):
    folder = server.repository(request)
    sha = server.revision(folder, request.params.get("rev", "main"))
    settings = server.repos.settings(folder)
    blobs = request.query.get("blobs", ["false"])[0].lower() in ("1", "true")
    siblings = []
    for path, is_dir in server.repos.walk(folder, sha):
        if not is_dir:
            sibling = {"rfilename": path}
            if blobs:
                entry = server.repos.entry(folder, sha, path, False)
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    lfs = entry["lfs"]
                    pointer = lfs["pointerSize"]
                    sibling["lfs"] = {
                        "size": lfs["size"],
                        "sha256": lfs["oid"],
                        "pointerSize": pointer,
                    }
            siblings.append(sibling)
    repo_id = request.params["repo"]
    commit = server.repos.commit_info(folder, sha)
    info = {
        "_id": folder_name(request.params["type"].rstrip("s"), repo_id),
        "id": repo_id,
        "author": repo_id.split("/")[0],
        "sha": sha,
        "lastModified": commit["date"],
        "createdAt": server.repos.history(folder, sha)[-1][1]["date"],
        "private": bool(settings.get("private")),
        "gated": "auto" if settings.get("gated") else False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
    }
    if request.params["type"] == "models":
        info["modelId"] = repo_id
    expand = request.query.get("expand") or request.query.get("expand[]")
    if expand:  # only the properties asked for
        info = {k: v for k, v in info.items() if k in expand or k in ("_id", "id")}
    return Response.json(info)


def _tree(server, request):
    folder = server.repository(request)
    sha = server.revision(folder, request.params["rev"])
    path = request.params.get("path", "").strip("/")
    recursive = request.query.get("recursive", ["false"])[0].lower() in ("1", "true")
    expand = request.query.get("expand", ["false"])[0].lower() in ("1", "true")
    entries = server.repos.walk(folder, sha, path)
    if entries is None:
        raise HubError(404, "EntryNotFound", f"{path} does not exist on {request.params['rev']}")
    if not recursive:
        entries = [
            (p, d) for p, d in entries if p.count("/") == (path.count("/") + 1 if path else 0)
        ]
    start = int(request.query.get("cursor", ["0"])[0])
    size = min(server.page_size, 50) if expand else server.page_size
    page = entries[start : start + size]
    body = [server.repos.entry(folder, sha, p, d, expand) for p, d in page]
    headers = {}
    if start + size < len(entries):
        query = {k: v[0] for k, v in request.query.items() if k != "cursor"}
        query["cursor"] = str(start + size)
        raw = urllib.parse.quote(request.path)
        headers["Link"] = f'<{server.url}{raw}?{urllib.parse.urlencode(query)}>; rel="next"'
    return Response.json(body, headers=headers)


def _paths_info(server, request):
    folder = server.repository(request)
    sha = server.revision(folder, request.params["rev"])
    form = urllib.parse.parse_qs(request.body.decode(), keep_blank_values=True)
    expand = form.get("expand", ["false"])[0].lower() in ("1", "true")
    out = []
    for path in form.get("paths", []):
        path = path.strip("/")
        if server.repos.file_path(folder, sha, path):
            out.append(server.repos.entry(folder, sha, path, False, expand))
        elif server.repos.walk(folder, sha, path) is not None:
            out.append(server.repos.entry(folder, sha, path, True, expand))
    return Response.json(out)


def _refs(server, request):
    folder = server.repository(request)
    tags = set(server.repos.settings(folder)["tags"])
    out = {"branches": [], "converts": [], "tags": [], "pullRequests": []}
    for name, sha in sorted(server.repos.refs(folder).items()):
        if name.startswith("refs/pr/"):
            out["pullRequests"].append({"name": name, "ref": name, "targetCommit": sha})
        elif name in tags:
            out["tags"].append({"name": name, "ref": f"refs/tags/{name}", "targetCommit": sha})
        else:
            out["branches"].append({"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha})
    return Response.json(out)


def _commits(server, request):
    folder = server.repository(request)
    sha = server.revision(folder, request.params["rev"])
    history = server.repos.history(folder, sha)
    return Response.json(
        [
            {
                "id": commit,
                "title": info["title"],
                "message": info["message"],
                "authors": [{"user": "bertjax-test"}],
                "date": info["date"],
            }
            for commit, info in history
        ]
    )


def _whoami(server, request):
    if request.token not in server.tokens:
        raise HubError(401, None, "Invalid credentials in Authorization header")
    return Response.json({"type": "user", "name": "bertjax-test", "auth": {"type": "access_token"}})


def _byte_range(request, size) -> tuple[int, int] | None:
    """(first, last) byte of a ``Range: bytes=A-B`` header (also ``A-`` and ``-N``), or None."""
    spec = request.headers.get("range")
    found = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip()) if spec else None
    if not found:
        return None
    first, last = found.groups()
    if not first:  # the last N bytes
        return max(size - int(last), 0), size - 1
    last = min(int(last), size - 1) if last else size - 1
    if int(first) >= size or int(first) > last:
        raise HubError(416, None, "Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
    return int(first), last


def _file(request, local, headers):
    size = os.path.getsize(local)
    span = _byte_range(request, size)
    first, last = span or (0, size - 1)
    with open(local, "rb") as f:
        f.seek(first)
        body = f.read(last - first + 1) if request.method == "GET" else b""
    headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
    headers["Content-Length"] = str(last - first + 1)
    if span:
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return Response(206 if span else 200, headers, body)


def _resolve(server, request):
    params = request.params
    params.setdefault("type", "models")
    folder = server.repository(request, files=True)
    sha = server.revision(folder, params["rev"])
    local = server.repos.file_path(folder, sha, params["path"])
    commit = {"X-Repo-Commit": sha}
    if local is None:
        raise HubError(404, "EntryNotFound", f"Entry not found: {params['path']}", commit)
    entry = server.repos.entry(folder, sha, params["path"], False)
    headers = {**commit, "ETag": f'"{entry["oid"]}"'}
    if "lfs" in entry:  # the Hub answers with a signed URL on its CDN
        relative = urllib.parse.quote(
            os.path.relpath(local, server.repos.root).replace(os.sep, "/")
        )
        location = f"{server.cdn_url}/_cdn/{relative}?sha256={entry['lfs']['oid']}"
        headers.update(
            {
                "Location": location,
                "X-Linked-Etag": f'"{entry["lfs"]["oid"]}"',
                "X-Linked-Size": str(entry["size"]),
            }
        )
        return Response(302, headers, b"")
    return _file(request, local, headers)


def _cdn(server, request):
    relative = request.params["path"]
    local = os.path.realpath(os.path.join(server.repos.root, *relative.split("/")))
    if not local.startswith(os.path.realpath(server.repos.root) + os.sep) or not os.path.isfile(
        local
    ):
        raise HubError(404, None, "NoSuchKey")
    return _file(request, local, {"ETag": f'"{request.query.get("sha256", [""])[0]}"'})


ROUTES = [
    (("GET",), "whoami", re.compile(r"^/api/whoami-v2$"), _whoami),
    (("GET",), "tree", re.compile(API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$"), _tree),
    (("POST",), "paths-info", re.compile(API + r"/paths-info/(?P<rev>[^/]+)$"), _paths_info),
    (("GET",), "refs", re.compile(API + r"/refs$"), _refs),
    (("GET",), "commits", re.compile(API + r"/commits/(?P<rev>[^/]+)$"), _commits),
    (("GET",), "info", re.compile(API + r"(?:/revision/(?P<rev>[^/]+))?$"), _info),
    (("GET", "HEAD"), "cdn", re.compile(r"^/_cdn/(?P<path>.+)$"), _cdn),
    (
        ("GET", "HEAD"),
        "resolve",
        re.compile(
            r"^/(?:(?P<type>datasets|spaces)/)?" + REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"
        ),
        _resolve,
    ),
]


# ---- pointing huggingface_hub at it ----


@contextlib.contextmanager
def use_endpoint(url: str, hf_home, token: str | None = None, offline: bool = False):
    """Inside, this process and its children talk to the Hub at ``url``, with their own cache and
    token file in ``hf_home`` and ``HF_TOKEN`` = ``token`` (unset: none; a user's token never
    reaches the test), or with ``offline`` make no request at all (``HF_HUB_OFFLINE=1``: the
    cache answers); everything is put back on exit."""
    env = {
        "HF_ENDPOINT": url,
        "HF_HOME": os.fspath(hf_home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": None,
        "HF_HUB_OFFLINE": "1" if offline else None,
        "HF_HUB_CACHE": None,
        "HF_TOKEN": token,
        "HF_TOKEN_PATH": None,
        "HUGGINGFACE_HUB_CACHE": None,
    }
    previous = {k: os.environ.get(k) for k in env}
    _set_environment(env)
    try:
        _reread_endpoint()
        yield url
    finally:
        _set_environment(previous)
        _reread_endpoint()


def _set_environment(values):
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _reread_endpoint():
    """Read huggingface_hub's settings from the environment again, as a new process would."""
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _http

    importlib.reload(constants)
    # The origins whose redirects are followed with the token (computed once, at import).
    _http._HUB_ORIGINS = frozenset(
        _http._url_origin(e)
        for e in (
            constants._HF_DEFAULT_ENDPOINT,
            constants._HF_DEFAULT_STAGING_ENDPOINT,
            constants.ENDPOINT,
        )
    )
    hf_api.api.endpoint = constants.ENDPOINT  # behind huggingface_hub.dataset_info & co.
    if "datasets" in sys.modules:  # datasets reads its own copies once, at import
        config = sys.modules["datasets"].config
        config.HF_ENDPOINT = constants.ENDPOINT
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = constants.HF_HUB_OFFLINE


def main(argv):
    server = HubServer(argv[1], port=int(argv[2]) if len(argv) > 2 else 0).start()
    print(f"serving {argv[1]}: HF_ENDPOINT={server.url}", flush=True)
    server._thread.join()


if __name__ == "__main__":
    main(sys.argv)
