"""The local Hub (tests/hub_server.py) answers huggingface_hub's real client as the Hub does:
revisions resolve to commits, trees page, files read by byte range (LFS ones through a 302 to
another origin), downloads land in the cache, gated and private repositories need a token, and
injected faults meet the client's own retries where it has them."""

import os
import subprocess
import sys
import time

import pytest
from hub_server import TOKEN

CORPUS = "bertjax-test/corpus"
MODEL = "bertjax-test/model"
BLOB = bytes(range(256)) * 40  # 10,240 bytes, stored with LFS (*.parquet)


@pytest.fixture(scope="module")
def repos(hub):
    first = hub.commit(CORPUS, {"data/a.jsonl": '{"text": "one"}\n', "README.md": "# corpus\n"})
    hub.tag(CORPUS, "v1", "main")
    files = {f"data/part-{i}.jsonl": f'{{"text": "{i}"}}\n' for i in range(5)}
    second = hub.commit(CORPUS, {**files, "data/sub/b.parquet": BLOB})
    model = hub.commit(MODEL, {"config.json": "{}", "model.safetensors": BLOB}, repo_type="model")
    hub.commit("bertjax-test/gated", {"a.txt": "gated text"}, gated=True)
    hub.commit("bertjax-test/private", {"a.txt": "private text"}, private=True)
    return {"v1": first, "main": second, "model": model}


def test_revisions_resolve_to_commits(hub, repos):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi()
    assert api.dataset_info(CORPUS).sha == repos["main"]
    assert api.dataset_info(CORPUS, revision="v1").sha == repos["v1"]
    assert api.dataset_info(CORPUS, revision=repos["v1"]).sha == repos["v1"]
    assert api.model_info(MODEL, revision="main").sha == repos["model"]
    refs = api.list_repo_refs(CORPUS, repo_type="dataset")
    assert [(r.name, r.target_commit) for r in refs.tags] == [("v1", repos["v1"])]
    assert [(r.name, r.target_commit) for r in refs.branches] == [("main", repos["main"])]
    commits = api.list_repo_commits(CORPUS, repo_type="dataset")
    assert [c.commit_id for c in commits] == [repos["main"], repos["v1"]]
    with pytest.raises(RevisionNotFoundError):
        api.dataset_info(CORPUS, revision="v2")
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("bertjax-test/missing")


def test_the_filesystem_lists_in_pages_and_reads_byte_ranges(hub, repos):
    from huggingface_hub import HfFileSystem

    hub.reset()
    hub.page_size = 2
    try:
        fs = HfFileSystem()
        found = fs.find(f"datasets/{CORPUS}@{repos['main']}/data")
    finally:
        hub.page_size = 1000
    names = [name.split("/data/", 1)[1] for name in found]
    assert names == ["a.jsonl", *(f"part-{i}.jsonl" for i in range(5)), "sub/b.parquet"]
    assert hub.count("tree") >= 4  # 8 entries, 2 a page
    assert fs.glob(f"datasets/{CORPUS}@v1/data/*.jsonl") == [f"datasets/{CORPUS}@v1/data/a.jsonl"]

    hub.reset()
    with fs.open(f"datasets/{CORPUS}@{repos['main']}/data/sub/b.parquet", block_size=1000) as f:
        f.seek(5000)
        assert f.read(300) == BLOB[5000:5300]
    # LFS: the Hub's 302, then a ranged read on the CDN (another origin)
    assert (hub.count("resolve", status=302), hub.count("cdn", status=206)) == (1, 1)
    with fs.open(f"datasets/{CORPUS}@{repos['main']}/data/part-3.jsonl", block_size=4) as f:
        f.seek(10)
        assert f.read(1) == b"3"
    assert hub.count("resolve", status=206) == 1


def test_downloads_land_in_the_cache_at_the_commit(hub, repos, tmp_path):
    from huggingface_hub import hf_hub_download, snapshot_download

    path = hf_hub_download(MODEL, "model.safetensors")
    assert repos["model"] in path and open(path, "rb").read() == BLOB
    folder = snapshot_download(CORPUS, repo_type="dataset", revision="v1")
    assert folder.endswith(repos["v1"])
    assert sorted(os.listdir(os.path.join(folder, "data"))) == ["a.jsonl"]
    local = snapshot_download(MODEL, local_dir=tmp_path / "model")
    assert sorted(os.listdir(local)) == [".cache", "config.json", "model.safetensors"]


def test_a_rate_limit_is_waited_out_by_the_clients_own_retries(hub, repos):
    """Range reads retry a 429 themselves, waiting the ``RateLimit`` header's reset + 1 s."""
    from huggingface_hub import HfFileSystem

    hub.reset()
    fault = hub.fail("resolve", 429, times=2, ratelimit_reset=0)
    start = time.monotonic()
    with HfFileSystem().open(f"datasets/{CORPUS}@{repos['main']}/data/sub/b.parquet") as f:
        f.seek(100)
        assert f.read(10) == BLOB[100:110]
    assert time.monotonic() - start >= 2.0  # two waits of 0 + 1 s
    assert fault.hits == 2 and hub.count("resolve") == 3


def test_server_errors_reach_callers_that_do_not_retry(hub, repos):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    hub.reset()
    hub.fail("info", 503, skip=1)
    api = HfApi()
    assert api.dataset_info(CORPUS).sha == repos["main"]  # skipped
    with pytest.raises(HfHubHTTPError) as raised:
        api.dataset_info(CORPUS)
    assert raised.value.response.status_code == 503
    assert api.dataset_info(CORPUS).sha == repos["main"]  # once only
    assert hub.count("info", status=503) == 1


def test_gated_and_private_repositories_need_a_token(hub, repos):
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    with pytest.raises(GatedRepoError):
        hf_hub_download("bertjax-test/gated", "a.txt", repo_type="dataset")
    with pytest.raises(GatedRepoError):
        hf_hub_download("bertjax-test/gated", "a.txt", repo_type="dataset", token="hf_other")
    path = hf_hub_download("bertjax-test/gated", "a.txt", repo_type="dataset", token=TOKEN)
    assert open(path).read() == "gated text"
    with pytest.raises(RepositoryNotFoundError):
        HfApi().dataset_info("bertjax-test/private")
    assert HfApi(token=TOKEN).dataset_info("bertjax-test/private").sha
    assert HfApi(token=TOKEN).whoami()["name"] == "bertjax-test"


def test_a_child_process_talks_to_it_from_its_environment(hub, repos):
    hub.reset()
    code = f"from huggingface_hub import HfApi; print(HfApi().dataset_info({CORPUS!r}).sha)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repos["main"]
    assert hub.count("info") == 1


def test_an_extension_route_is_served_first(hub, repos):
    from huggingface_hub.utils import get_session

    hub.route("POST", "preupload", r"^/api/datasets/[^/]+/[^/]+/preupload/main$", _preupload)
    reply = get_session().post(f"{hub.url}/api/datasets/{CORPUS}/preupload/main", json={})
    assert reply.json() == {"files": []} and hub.count("preupload") == 1


def _preupload(server, request):
    from hub_server import Response

    return Response.json({"files": []})
