"""Corpora on the Hugging Face Hub: ``hf://datasets/OWNER/NAME[@REVISION][/GLOB]``, read through
huggingface_hub's own client.

A revision (a branch, a tag, ``refs/convert/parquet``, a commit) is resolved once to its commit
SHA (`pin`) and every file is then named and read at that SHA, so a resumed or repeated run reads
the same bytes even after the branch moved (HfFileSystem alone reads a branch as it is at each
request). Without a GLOB the files are the dataset card's: the ``configs:`` of its README.md,
the subset ``config.data.hf_subset`` (default: the card's default) and split
``config.data.hf_split``. The files of a pinned URL are listed once per process (`files`, kept:
a commit never changes), or given by the process that listed them (`remember`).

Reads are ranged GETs of ``resolve/SHA/PATH`` (`open_file`: the Hub's 302 to its CDN followed for
LFS files), through huggingface_hub's HTTP session and token (``HF_TOKEN``, or the saved login);
each range is tried again on transient errors within the storage retry budget
(bertjax/retry.py), on top of the client's own retries of 429s, which wait what the Hub's
``RateLimit`` header says. `download` keeps a whole file in the local cache with
``hf_hub_download`` (resumed after a kill, never fetched twice at a commit).

Bad input stops with one line (`HubError`, a ValueError): a repository, revision or pattern that
does not exist, a gated dataset without a token, a subset or split the card does not have, an
offline machine."""

from __future__ import annotations

import dataclasses
import io
import re
import threading

from bertjax import retry

PREFIX = "hf://"
_KINDS = {"datasets": "dataset", "models": "model", "spaces": "space"}
_SHA = re.compile(r"[0-9a-f]{40}")
BLOCK_BYTES = 8 << 20  # bytes a ranged read asks for at most (sequential text reads)
TAIL_BYTES = 64 << 10  # ... past the end its reader said it needs (the rest of a line)


class HubError(ValueError):
    """A Hub corpus that cannot be read as given (one line: what, where, what to do)."""


def is_hub(spec: str) -> bool:
    return str(spec).startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class HubPath:
    """``hf://{kind}s/{repo_id}@{revision}/{pattern}`` taken apart."""

    kind: str  # "dataset", "model" or "space"
    repo_id: str
    revision: str  # as given; "main" when none
    pattern: str  # a path or glob inside the repository; "" = the dataset card's files

    @property
    def pinned(self) -> bool:
        return bool(_SHA.fullmatch(self.revision))

    def url(self, path: str | None = None, revision: str | None = None) -> str:
        path = self.pattern if path is None else path
        where = f"{PREFIX}{self.kind}s/{self.repo_id}@{revision or self.revision}"
        return f"{where}/{path}" if path else where


def parse(url: str) -> HubPath:
    """The parts of an hf:// URL; a malformed one is a HubError naming it."""
    rest = str(url)[len(PREFIX) :]
    kind, _, rest = rest.partition("/")
    if kind not in _KINDS:
        kind, rest = "datasets", f"{kind}/{rest}"  # hf://OWNER/NAME: a dataset, as datasets reads
    parts = rest.split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise HubError(
            f"config.data.corpus={url!r}: expected hf://datasets/OWNER/NAME[@REVISION][/GLOB]"
        )
    name, _, revision = parts[1].partition("@")
    pattern = "/".join(parts[2:])
    if revision.startswith("refs") and pattern.startswith(("convert/", "pr/")):  # refs/pr/1
        head, _, pattern = pattern.partition("/")
        tail, _, pattern = pattern.partition("/")
        revision = f"{revision}/{head}/{tail}"
    return HubPath(_KINDS[kind], f"{parts[0]}/{name}", revision or "main", pattern.strip("/"))


def _client() -> dict:
    """How bertjax names itself to the Hub (User-Agent: bertjax/VERSION; ...)."""
    import bertjax

    out = {"library_name": "bertjax", "library_version": bertjax.__version__}
    return {**out, "user_agent": dict(USER_AGENT)} if USER_AGENT else out


def _api():
    from huggingface_hub import HfApi

    return HfApi(**_client())


def _call(what: str, fn, *args, start: bool = False, **kwargs):
    """``fn`` under the storage retry budget, its bad-input errors as one HubError line.
    ``start``: a request of a run's start (resolving, listing): a Hub that cannot be reached at
    all stops the run at once (an offline machine), instead of being waited for."""
    from huggingface_hub import constants, errors

    try:
        attempt = retry.current().attempt(what)
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as error:  # noqa: BLE001  (not transient: raised again at once)
                if start and _unreachable(error):
                    raise
                attempt.failed(error)
            else:
                attempt.succeeded()
                return result
    except errors.GatedRepoError as e:
        raise HubError(
            f"{what} is a gated dataset: accept its conditions on its Hub page and set HF_TOKEN "
            f"to a token of that account ({_first_line(e)})"
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"{what}: no such repository on {constants.ENDPOINT} (check OWNER/NAME; a private one "
            "needs HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{what}: no such revision (a branch, tag or commit SHA)") from None
    except errors.OfflineModeIsEnabled:
        raise HubError(
            f"{what}: HF_HUB_OFFLINE is set, and a Hub corpus is read from the Hub: unset it, or "
            "train from a local copy (config.data.corpus=PATH) or a prepared store"
        ) from None
    except Exception as e:
        if start and _unreachable(e):
            raise HubError(
                f"{what}: cannot reach the Hub at {constants.ENDPOINT} ({_first_line(e)}): this "
                "machine is offline, or HF_ENDPOINT is wrong"
            ) from None
        raise


def _unreachable(error: BaseException) -> bool:
    """A connection that could not be made at all (no network, no such host or port)."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__}
    return bool(names & {"httpx2.ConnectError", "httpx.ConnectError"})


def _first_line(error) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


def resolve_revision(path: HubPath) -> str:
    """The commit SHA ``path``'s revision names now."""
    if path.pinned:
        return path.revision
    api = _api()
    info = api.dataset_info if path.kind == "dataset" else api.model_info
    if path.kind == "space":
        info = api.space_info
    where = f"{path.url('', path.revision)}"
    return _call(where, info, path.repo_id, revision=path.revision, start=True).sha


def pin(url: str, subset: str = "", split: str = "train") -> str:
    """``url`` at the commit its revision names now, its files' patterns spelled out: one pinned
    hf:// URL per pattern, comma-separated (no GLOB: the card's files of subset/split)."""
    path = parse(url)
    sha = resolve_revision(path)
    if path.pattern and (subset or split not in ("", "train")):
        raise HubError(
            f"config.data.corpus={url!r} names its files: leave config.data.hf_subset and "
            "config.data.hf_split unset, or drop the glob to take them from the dataset card"
        )
    patterns = [path.pattern] if path.pattern else card_patterns(path, sha, subset, split)
    return ",".join(path.url(p, sha) for p in patterns)


def card_patterns(path: HubPath, sha: str, subset: str, split: str) -> list[str]:
    """The file patterns of a subset's split in the dataset card's ``configs:`` (README.md)."""
    import yaml

    card = _read_small(path.url("README.md", sha)) or b""
    text = card.decode("utf-8", "replace")
    header = re.match(r"---\s*\n(.*?)\n---", text, re.DOTALL)
    configs = (yaml.safe_load(header.group(1)) or {}).get("configs") if header else None
    where = path.url("", sha)
    if not configs:
        raise HubError(
            f"{where}: its dataset card names no configs: give the files, "
            f"config.data.corpus='{path.url('GLOB', path.revision)}' (e.g. data/*.parquet)"
        )
    names = [c.get("config_name", "default") for c in configs]
    if subset:
        chosen = [c for c in configs if c.get("config_name", "default") == subset]
    else:
        chosen = [c for c in configs if c.get("default")] or configs[:1]
    if not chosen:
        raise HubError(f"config.data.hf_subset={subset!r}: {where} has the subsets {names}")
    files = chosen[0].get("data_files", [])
    if isinstance(files, str | list) and not (files and isinstance(files[0], dict)):
        files = [{"split": "train", "path": files}]
    for entry in files:
        if entry.get("split", "train") == split:
            found = entry["path"]
            return [found] if isinstance(found, str) else list(found)
    splits = [entry.get("split", "train") for entry in files]
    raise HubError(
        f"config.data.hf_split={split!r}: subset {names[configs.index(chosen[0])]!r} of {where} "
        f"has the splits {splits}"
    )


def _read_small(url: str) -> bytes | None:
    """A small file of a repository (a card), None when there is none."""
    from huggingface_hub import errors

    try:
        with open_file(url) as f:
            return f.read()
    except errors.EntryNotFoundError:
        return None


_FILES: dict[str, list[tuple[str, int]]] = {}
_LOCK = threading.Lock()


def remember(url: str, listed: list) -> None:
    """The files of pinned ``url``, listed by another process (its broadcast), kept."""
    with _LOCK:
        _FILES[url] = [(str(u), int(s)) for u, s in listed]


def files(url: str) -> list[tuple[str, int]]:
    """(pinned URL, size) of every file ``url`` (pinned or not) names, sorted; listed once a
    process, through the Hub's tree API at the commit."""
    path = parse(url)
    if not path.pinned:
        url = pin(url)
        path = parse(url)
    with _LOCK:
        if url in _FILES:
            return _FILES[url]
    from fsspec.utils import glob_translate

    pattern = path.pattern
    glob = any(c in pattern for c in "*?[")
    prefix = pattern.split("*")[0].split("?")[0].split("[")[0].rpartition("/")[0] if glob else ""
    if glob:
        matches = re.compile(glob_translate(pattern)).match
        listed = [(p, n) for p, n in _tree(path, prefix) if matches(p)]
    else:  # a file, a folder, or the whole repository
        listed = _tree(path, pattern) or [(p, n) for p, n in _tree(path, "") if p == pattern]
    listed = sorted((path.url(p), n) for p, n in listed)
    if not listed:
        there = sorted(p for p, _ in _tree(path, ""))[:8]
        shown = ", ".join(there) or "no files"
        raise HubError(
            f"config.data.corpus={url!r}: no file of {path.repo_id} at {path.revision[:12]} "
            f"matches {pattern!r} (it has: {shown}{', ...' if len(there) == 8 else ''})"
        )
    remember(url, listed)
    return _FILES[url]


def _tree(path: HubPath, folder: str) -> list[tuple[str, int]]:
    """(path, size) of every file below ``folder`` of the repository at ``path``'s commit (tree
    pages of the Hub's API); [] when there is no such folder."""
    from huggingface_hub import errors

    api, where = _api(), path.url(folder)

    def listing():
        entries = api.list_repo_tree(
            path.repo_id, folder or None, recursive=True, revision=path.revision,
            repo_type=path.kind,
        )  # fmt: skip
        return [(e.path, int(e.size)) for e in entries if hasattr(e, "size")]

    try:
        return _call(where, listing, start=True)
    except errors.EntryNotFoundError:
        return []


def _where(url: str) -> tuple[HubPath, str]:
    """(the parts of a file URL, its resolve URL at its revision)."""
    from huggingface_hub import hf_hub_url

    path = parse(url)
    return path, hf_hub_url(path.repo_id, path.pattern, repo_type=path.kind, revision=path.revision)


USER_AGENT: dict = {}  # what a process adds to its requests' User-Agent (its index, in a pod)


class _RangeReader(io.RawIOBase):
    """A file of the Hub read by ranged GETs (each tried again within the retry budget)."""

    def __init__(self, url: str, size: int | None, stop: int | None = None):
        from huggingface_hub.utils import build_hf_headers

        self.url, self.stop = url, stop
        _, self.resolve = _where(url)
        self.headers = build_hf_headers(**_client())
        self.position = 0
        self.size = size if size is not None else self._size()

    def _size(self) -> int:
        from huggingface_hub import get_hf_file_metadata

        return int(_call(self.url, get_hf_file_metadata, self.resolve, headers=self.headers).size)

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def _get(self, first: int, last: int) -> bytes:
        from huggingface_hub.utils import hf_raise_for_status, http_backoff

        headers = {**self.headers, "Range": f"bytes={first}-{last}"}
        response = http_backoff("GET", self.resolve, headers=headers)
        hf_raise_for_status(response)
        data = response.content
        if len(data) != last - first + 1:  # the connection ended early: a transient error
            raise ConnectionError(f"{self.url}: got {len(data)} of {last - first + 1} bytes")
        return data

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.size - self.position)
        if self.stop is not None:  # past it, a line's end is near: small reads
            ahead = self.stop - self.position
            count = min(count, ahead if ahead > 0 else TAIL_BYTES)
        if count <= 0:
            return 0
        first, last = self.position, self.position + count - 1
        data = _call(self.url, self._get, first, last)
        buffer[:count] = data
        self.position += count
        return count


def open_file(url: str, size: int | None = None, stop: int | None = None):
    """A binary, seekable file object of a pinned (or not) hf:// file URL; ``stop``: the byte
    its reader needs up to (reads past it ask for TAIL_BYTES at a time)."""
    return io.BufferedReader(_RangeReader(url, size, stop), buffer_size=BLOCK_BYTES)


def download(url: str, cache: str) -> str:
    """A local copy of a pinned hf:// file in ``cache``/hub (huggingface_hub's cache layout):
    fetched once at its commit, a killed download resumed."""
    from huggingface_hub import hf_hub_download

    path = parse(url)
    return _call(
        url,
        hf_hub_download,
        path.repo_id,
        path.pattern,
        repo_type=path.kind,
        revision=path.revision,
        cache_dir=f"{cache}/hub",
        **_client(),
    )
