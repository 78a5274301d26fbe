"""Hub repositories in a folder, for the local Hub server (tests/hub_server.py).

The folder has the layout of huggingface_hub's own cache, one folder a repository:

    ROOT/datasets--OWNER--NAME/refs/main           a branch or tag: the commit's 40-hex SHA
    ROOT/datasets--OWNER--NAME/refs/refs/pr/1      (a special ref, as the cache spells it)
    ROOT/datasets--OWNER--NAME/snapshots/SHA/...   the repository's files at that commit
    ROOT/datasets--OWNER--NAME/hub.json            what the cache does not hold: commit titles,
                                                   dates and parents, tags, gated, private
    ROOT/models--OWNER--NAME/...                   (models; spaces--... the same)

so a folder of snapshots made by ``hf_hub_download``/``snapshot_download`` can be served as it is
(a missing hub.json reads as: public, every ref a branch). `HubRepos.commit` writes a new commit
the way the Hub would: the parent's files plus the changed ones, a SHA that depends on the parent
and the content, the branch moved to it.

What a file looks like to the Hub's API (`entry`): a git blob id (sha1 of ``blob N\\0`` + bytes),
and for a file stored with Git LFS (matched by the snapshot's .gitattributes ``filter=lfs`` lines,
else the Hub's default patterns, and every file of 10 MiB or more) the sha256 of its bytes and the
size of its pointer file, as the Hub's tree listing reports them."""

import fnmatch
import hashlib
import json
import os
import shutil
import threading

REPO_TYPES = ("model", "dataset", "space")
# The Hub's default .gitattributes (its LFS lines, the ones a corpus or a model uses).
DEFAULT_LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.gz *.h5 *.lz4 *.model *.msgpack *.npy *.npz *.onnx *.ot "
    "*.parquet *.pb *.pickle *.pkl *.pt *.pth *.safetensors *.tar *.tflite *.tgz *.wasm *.xz "
    "*.zip *.zst"
).split()
LFS_MIN_SIZE = 10 * 1024 * 1024
BASE_DATE = 1_700_000_000  # commit n of a repository is dated BASE_DATE + n hours (UTC)


def folder_name(repo_type: str, repo_id: str) -> str:
    """``datasets--OWNER--NAME``: the cache's name for a repository."""
    if repo_type not in REPO_TYPES:
        raise ValueError(f"repo_type {repo_type!r}: one of {REPO_TYPES}")
    return f"{repo_type}s--" + repo_id.replace("/", "--")


def iso_date(seconds: float) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def git_oid(kind: bytes, content: bytes) -> str:
    return hashlib.sha1(kind + b" %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


class HubRepos:
    """The repositories under ``root``: resolve revisions, describe files, write commits."""

    def __init__(self, root):
        self.root = os.fspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()
        self._hashes = {}  # (real path, size, mtime) -> (blob oid, sha256)
        self._trees = {}  # (folder, commit, path) -> tree oid (a commit's files never change)

    # ---- reading ----

    def folder(self, repo_type: str, repo_id: str) -> str | None:
        """The repository's folder, or None where there is no such repository."""
        if repo_id.count("/") != 1 or any(p in ("", ".", "..") for p in repo_id.split("/")):
            return None
        path = os.path.join(self.root, folder_name(repo_type, repo_id))
        return path if os.path.isdir(path) else None

    def settings(self, folder: str) -> dict:
        path = os.path.join(folder, "hub.json")
        if not os.path.exists(path):
            return {"commits": {}, "tags": [], "gated": False, "private": False}
        with open(path) as f:
            return json.load(f)

    def refs(self, folder: str) -> dict[str, str]:
        """Every ref (a branch, a tag, ``refs/pr/N``) and the commit SHA it names."""
        out = {}
        base = os.path.join(folder, "refs")
        for directory, _, files in os.walk(base):
            for name in files:
                if name.endswith(".tmp"):
                    continue
                path = os.path.join(directory, name)
                with open(path) as f:
                    out[os.path.relpath(path, base).replace(os.sep, "/")] = f.read().strip()
        return out

    def resolve(self, folder: str, revision: str) -> str | None:
        """The commit SHA a revision (a ref or a full SHA) names, or None."""
        snapshots = os.path.join(folder, "snapshots")
        if len(revision) == 40 and os.path.isdir(os.path.join(snapshots, revision)):
            return revision
        sha = self.refs(folder).get(revision)
        return sha if sha and os.path.isdir(os.path.join(snapshots, sha)) else None

    def snapshot(self, folder: str, sha: str) -> str:
        return os.path.join(folder, "snapshots", sha)

    def walk(self, folder: str, sha: str, path: str = "") -> list[tuple[str, bool]] | None:
        """(path in repo, is a directory) of every entry below ``path``, directories first at each
        level (the Hub's "tree first" order); None where ``path`` is not a directory there."""
        top = os.path.join(self.snapshot(folder, sha), *path.split("/")) if path else None
        top = top or self.snapshot(folder, sha)
        if not os.path.isdir(top):
            return None
        out = []

        def visit(directory, prefix):
            names = sorted(os.listdir(directory))
            dirs = [n for n in names if os.path.isdir(os.path.join(directory, n))]
            files = [n for n in names if n not in dirs]
            for name in dirs:
                out.append((prefix + name, True))
                visit(os.path.join(directory, name), prefix + name + "/")
            out.extend((prefix + name, False) for name in files)

        visit(top, path + "/" if path else "")
        return out

    def file_path(self, folder: str, sha: str, path: str) -> str | None:
        """The local file of ``path`` at a commit, or None (missing, a directory, outside)."""
        parts = path.split("/")
        if any(p in ("", ".", "..") for p in parts):
            return None
        local = os.path.join(self.snapshot(folder, sha), *parts)
        return local if os.path.isfile(local) else None

    def is_lfs(self, folder: str, sha: str, path: str, size: int) -> bool:
        if size >= LFS_MIN_SIZE:
            return True
        patterns = DEFAULT_LFS_PATTERNS
        attributes = self.file_path(folder, sha, ".gitattributes")
        if attributes:
            with open(attributes) as f:
                lines = [line.split() for line in f if "filter=lfs" in line]
            patterns = [words[0] for words in lines if words]
        name = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(path if "/" in p else name, p) for p in patterns)

    def hashes(self, local: str) -> tuple[str, str]:
        """(git blob id, sha256) of a file's bytes, cached while the file is unchanged."""
        stat = os.stat(local)
        key = (os.path.realpath(local), stat.st_size, stat.st_mtime_ns)
        if key not in self._hashes:
            with open(local, "rb") as f:
                content = f.read()
            self._hashes[key] = (git_oid(b"blob", content), hashlib.sha256(content).hexdigest())
        return self._hashes[key]

    def entry(self, folder: str, sha: str, path: str, is_dir: bool, expand: bool = False) -> dict:
        """One entry of the Hub's tree and paths-info answers."""
        if is_dir:
            out = {"type": "directory", "oid": self.tree_oid(folder, sha, path), "path": path}
        else:
            local = self.file_path(folder, sha, path)
            size = os.path.getsize(local)
            blob, sha256 = self.hashes(local)
            out = {"type": "file", "oid": blob, "size": size, "path": path}
            if self.is_lfs(folder, sha, path, size):
                pointer = lfs_pointer(sha256, size)
                out["oid"] = git_oid(b"blob", pointer)
                out["lfs"] = {"oid": sha256, "size": size, "pointerSize": len(pointer)}
        if expand:
            commit = self.commit_info(folder, sha)
            out["lastCommit"] = {"id": sha, "title": commit["title"], "date": commit["date"]}
        return out

    def tree_oid(self, folder: str, sha: str, path: str) -> str:
        """The git tree id of a directory (entries ``mode name\\0`` + binary id, sorted)."""
        if (folder, sha, path) in self._trees:
            return self._trees[folder, sha, path]
        rows = []
        for name in sorted(os.listdir(os.path.join(self.snapshot(folder, sha), *path.split("/")))):
            child = f"{path}/{name}" if path else name
            is_dir = self.file_path(folder, sha, child) is None
            oid = self.entry(folder, sha, child, is_dir)["oid"]
            rows.append((b"40000 " if is_dir else b"100644 ") + name.encode() + b"\0")
            rows[-1] += bytes.fromhex(oid)
        self._trees[folder, sha, path] = git_oid(b"tree", b"".join(rows))
        return self._trees[folder, sha, path]

    def commit_info(self, folder: str, sha: str) -> dict:
        known = self.settings(folder)["commits"].get(sha)
        return known or {"title": "", "message": "", "date": iso_date(BASE_DATE), "parent": None}

    def history(self, folder: str, sha: str) -> list[tuple[str, dict]]:
        """The commit and its ancestors, newest first."""
        out = []
        while sha:
            info = self.commit_info(folder, sha)
            out.append((sha, info))
            sha = info.get("parent")
        return out

    # ---- writing ----

    def commit(
        self,
        repo_id: str,
        files: dict,
        *,
        repo_type: str = "dataset",
        branch: str = "main",
        message: str = "",
        gated: bool | None = None,
        private: bool | None = None,
    ) -> str:
        """A new commit on ``branch`` (made if missing): the branch's files, then ``files``
        ({path: bytes | str | local file path (os.PathLike) | None to delete}); returns its SHA."""
        with self._lock:
            folder = os.path.join(self.root, folder_name(repo_type, repo_id))
            os.makedirs(os.path.join(folder, "refs"), exist_ok=True)
            settings = self.settings(folder)
            parent = self.refs(folder).get(branch)
            staged = os.path.join(folder, "snapshots", ".staging")
            shutil.rmtree(staged, ignore_errors=True)
            if parent:
                shutil.copytree(self.snapshot(folder, parent), staged, symlinks=False)
            else:
                os.makedirs(staged)
            digest = hashlib.sha1((parent or "").encode())
            for path, content in sorted(files.items()):
                local = os.path.join(staged, *path.split("/"))
                if content is None:
                    os.remove(local)
                    continue
                if isinstance(content, os.PathLike):
                    with open(content, "rb") as f:
                        content = f.read()
                if isinstance(content, str):
                    content = content.encode()
                os.makedirs(os.path.dirname(local), exist_ok=True)
                with open(local, "wb") as f:
                    f.write(content)
            for directory, _, names in sorted(os.walk(staged)):
                for name in sorted(names):
                    local = os.path.join(directory, name)
                    digest.update(os.path.relpath(local, staged).encode() + b"\0")
                    digest.update(self.hashes(local)[0].encode())
            sha = digest.hexdigest()
            target = self.snapshot(folder, sha)
            if os.path.isdir(target):  # the same files on the same parent: the same commit
                shutil.rmtree(staged)
            else:
                os.rename(staged, target)
            when = BASE_DATE + 3600 * len(settings["commits"])
            settings["commits"][sha] = {
                "title": message or f"Upload {len(files)} files",
                "message": "",
                "date": iso_date(when),
                "parent": parent,
            }
            for key, value in (("gated", gated), ("private", private)):
                if value is not None:
                    settings[key] = value
            self._write(folder, settings)
            self._write_ref(folder, branch, sha)
            return sha

    def tag(self, repo_id: str, tag: str, revision: str, *, repo_type: str = "dataset") -> str:
        """A tag naming the commit ``revision`` names; returns its SHA."""
        folder = self.folder(repo_type, repo_id)
        sha = self.resolve(folder, revision)
        with self._lock:
            settings = self.settings(folder)
            settings["tags"] = sorted(set(settings["tags"]) | {tag})
            self._write(folder, settings)
            self._write_ref(folder, tag, sha)
        return sha

    def _write(self, folder, settings):
        with open(os.path.join(folder, "hub.json.tmp"), "w") as f:
            json.dump(settings, f, indent=1)
        os.replace(os.path.join(folder, "hub.json.tmp"), os.path.join(folder, "hub.json"))

    def _write_ref(self, folder, ref, sha):
        path = os.path.join(folder, "refs", *ref.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(sha)
        os.replace(path + ".tmp", path)
