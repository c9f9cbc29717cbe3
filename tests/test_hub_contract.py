"""Contract tests: moebake's upload and Hub-source download through the real ``huggingface_hub`` client,
against a loopback Hub (pytest-httpserver) implementing the endpoints that client uses without Xet.

Endpoints (read from huggingface_hub 2.4's source: ``hf_api.py``, ``_commit_api.py``, ``lfs.py``,
``_snapshot_download.py``, ``file_download.py``):
  POST /api/repos/create                          create_repo (409 with the url if it exists)
  POST /api/models/{repo}/branch/{branch}         create_branch
  POST /api/validate-yaml                         README.md front matter check before a commit
  POST /api/models/{repo}/preupload/{rev}         upload mode (regular/lfs) and remote oid of each file
  POST /{repo}.git/info/lfs/objects/batch         LFS upload actions (none for objects already stored)
  PUT  {upload href}                              LFS object bytes
  POST /api/models/{repo}/commit/{rev}            NDJSON commit: header line, then one line per file
  GET  /api/models/{repo}/revision/{rev}          repo_info: resolves a revision to its commit
  GET  /api/models/{repo}/tree/{sha}              the file list (recursive)
  HEAD/GET /{repo}/resolve/{sha}/{path}           file metadata (X-Repo-Commit, ETag, size) and bytes

The default test environment has ``HF_HUB_OFFLINE=1``; these tests turn offline mode off only for
themselves (the module constant huggingface_hub reads per request), force the non-Xet path, use a
private cache, and refuse every socket connection that is not to loopback.
"""

import base64
import hashlib
import json
import re
import socket
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub import HfApi, constants

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import MoebakeError
from moebake.hub import client as hub_client_module
from moebake.hub.download import resolve_source
from moebake.hub.publish import publish
from moebake.synthetic import write_gpt_oss
from tests.conftest import TINY

# The loopback Hub: pytest-httpserver and its werkzeug (test extras, installed by bin/setup).
pytest.importorskip("pytest_httpserver", reason="the loopback Hub needs pytest-httpserver (bin/setup installs it)")
Response = pytest.importorskip("werkzeug").Response

TOKEN = "hf_loopback_token"
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<op>preupload|commit|revision|tree|branch)/(?P<rev>.+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[0-9a-f]{40})/(?P<path>.+)$")
_LFS_BATCH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch$")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


class LoopbackHub:
    """Repos as ``{refs: {name: commit}, commits: {commit: {path: bytes}}}``; every request is logged."""

    def __init__(self, server):
        self.endpoint = server.url_for("/").rstrip("/")
        self.repos, self.lfs, self.requests, self.commits, self.fail_next_commit = {}, {}, [], [], False
        server.expect_request(re.compile(".*")).respond_with_handler(self.handle)

    # -- state -----------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes], private: bool = False) -> str:
        self.repos[repo_id] = {"private": private, "refs": {}, "commits": {}, "prs": 0}
        return self._store_commit(repo_id, "main", files)

    def _store_commit(self, repo_id, ref, files) -> str:
        repo = self.repos[repo_id]
        sha = hashlib.sha1(json.dumps([repo_id, ref, len(self.commits), sorted(files)]).encode()).hexdigest()
        repo["commits"][sha] = dict(files)
        repo["refs"][ref] = sha
        for path, data in files.items():
            if is_lfs(path):
                self.lfs[hashlib.sha256(data).hexdigest()] = data
        return sha

    def head(self, repo_id: str, ref: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return repo["commits"][repo["refs"][ref]]

    def _resolve(self, repo_id, rev):
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, _error(404, "RepoNotFound")
        sha = repo["refs"].get(rev, rev if rev in repo["commits"] else None)
        return (sha, None) if sha else (None, _error(404, "RevisionNotFound"))

    # -- HTTP ------------------------------------------------------------------------------------
    def handle(self, request):
        self.requests.append((request.method, request.path, request.args.to_dict(), request.headers.get("Authorization")))
        path = request.path
        if path == "/api/repos/create":
            body = request.get_json()
            repo_id = f"{body['organization']}/{body['name']}"
            if repo_id in self.repos:  # the Hub's 409 carries the url; create_repo(exist_ok=True) returns it
                return _json({"error": "You already created this model repo", "url": f"{self.endpoint}/{repo_id}"}, 409)
            self.add_repo(
                repo_id,
                {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"},
                private=body.get("visibility") == "private",
            )
            return _json({"url": f"{self.endpoint}/{repo_id}", "name": repo_id})
        if path == "/api/validate-yaml":
            return _json({"errors": [], "warnings": []})
        if path.startswith("/lfs-upload/"):
            oid, data = path.rsplit("/", 1)[1], request.get_data()
            if hashlib.sha256(data).hexdigest() != oid:
                return _error(400, None, "sha256 mismatch")
            self.lfs[oid] = data
            return Response(status=200)
        if match := _LFS_BATCH.match(path):
            objects = [
                {
                    "oid": o["oid"],
                    "size": o["size"],
                    "authenticated": True,
                    **({} if o["oid"] in self.lfs else {"actions": {"upload": {"href": f"{self.endpoint}/lfs-upload/{o['oid']}"}}}),
                }
                for o in request.get_json()["objects"]
            ]
            return _json({"transfer": "basic", "objects": objects})
        if match := _API.match(path):
            return getattr(self, "_" + match["op"])(request, match["repo"], urllib.parse.unquote(match["rev"]))
        if match := _RESOLVE.match(path):
            files = self.repos[match["repo"]]["commits"].get(match["rev"], {})
            if match["path"] not in files:
                return _error(404, "EntryNotFound")
            data = files[match["path"]]
            etag = hashlib.sha256(data).hexdigest() if is_lfs(match["path"]) else git_blob_sha1(data)
            headers = {"X-Repo-Commit": match["rev"], "ETag": f'"{etag}"', "Content-Length": str(len(data))}
            return Response(data, headers=headers)  # werkzeug sends no body for HEAD, keeps Content-Length
        return _error(404, None, f"loopback hub has no route for {request.method} {path}")

    def _preupload(self, request, repo_id, rev):
        sha, error = self._resolve(repo_id, "main" if request.args.get("create_pr") else rev)
        if error:
            return error
        existing = self.repos[repo_id]["commits"][sha]
        files = []
        for f in request.get_json()["files"]:
            old = existing.get(f["path"])
            oid = None if old is None else (hashlib.sha256(old).hexdigest() if is_lfs(f["path"]) else git_blob_sha1(old))
            files.append({"path": f["path"], "uploadMode": "lfs" if is_lfs(f["path"]) else "regular", "shouldIgnore": False, "oid": oid})
        return _json({"files": files})

    def _commit(self, request, repo_id, rev):
        if self.fail_next_commit:
            self.fail_next_commit = False
            return _error(500, None, "commit failed (simulated interruption)")
        create_pr = request.args.get("create_pr") == "1"
        base, error = self._resolve(repo_id, "main" if create_pr else rev)
        if error:
            return error
        lines = [json.loads(line) for line in request.get_data().splitlines() if line]
        header, operations = lines[0], lines[1:]
        files = dict(self.repos[repo_id]["commits"][base])
        for op in operations:
            value = op["value"]
            if op["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif op["key"] == "lfsFile":
                if value["oid"] not in self.lfs:
                    return _error(400, None, f"LFS object {value['oid']} was never uploaded")
                files[value["path"]] = self.lfs[value["oid"]]
            elif op["key"] == "deletedFile":
                files.pop(value["path"], None)
        repo = self.repos[repo_id]
        if create_pr:
            repo["prs"] += 1
            ref = f"refs/pr/{repo['prs']}"
        else:
            ref = rev
        sha = self._store_commit(repo_id, ref, files)
        self.commits.append({"repo": repo_id, "ref": ref, "header": header["value"], "operations": operations})
        return _json(
            {
                "commitUrl": f"{self.endpoint}/{repo_id}/commit/{sha}",
                "commitOid": sha,
                "pullRequestUrl": f"{self.endpoint}/{repo_id}/discussions/{repo['prs']}" if create_pr else None,
            }
        )

    def _revision(self, request, repo_id, rev):
        sha, error = self._resolve(repo_id, rev)
        if error:
            return error
        files = self.repos[repo_id]["commits"][sha]
        return _json(
            {"id": repo_id, "sha": sha, "private": self.repos[repo_id]["private"], "siblings": [{"rfilename": p} for p in sorted(files)]}
        )

    def _tree(self, request, repo_id, rev):
        sha, error = self._resolve(repo_id, rev)
        if error:
            return error
        entries = []
        for path, data in sorted(self.repos[repo_id]["commits"][sha].items()):
            entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
            if is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return _json(entries)

    def _branch(self, request, repo_id, branch):
        repo = self.repos[repo_id]
        if branch in repo["refs"]:
            return _error(409, None, "Branch already exists")
        repo["refs"][branch] = repo["refs"]["main"]
        return _json({})


def _json(value, status=200):
    return Response(json.dumps(value), status=status, content_type="application/json")


def _error(status, code, message="error"):
    headers = {"X-Error-Code": code} if code else {}
    return Response(json.dumps({"error": message}), status=status, content_type="application/json", headers=headers)


@pytest.fixture()
def loopback_only(monkeypatch):
    """Every socket connection that is not to loopback fails."""
    real_connect = socket.socket.connect

    def connect(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"test tried to reach {address}: only loopback is allowed")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture()
def hub(httpserver, loopback_only, monkeypatch, tmp_path):
    """A loopback Hub, with huggingface_hub online only for it, without Xet, and a private cache."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return LoopbackHub(httpserver)


@pytest.fixture()
def api(hub):
    return HfApi(endpoint=hub.endpoint, token=TOKEN)


@pytest.fixture()
def baked(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    return out


def test_without_a_reachable_hub_a_repo_spec_fails_in_one_line(loopback_only, monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(MoebakeError) as caught:  # offline (bin/test) or nothing listening on the port
        resolve_source("openai/gpt-oss-20b", HfApi(endpoint="http://127.0.0.1:9", token=TOKEN))
    prefix = "openai/gpt-oss-20b: neither a local folder nor reachable on the Hugging Face Hub: "
    assert str(caught.value).startswith(
        (
            prefix + "offline mode is on (HF_HUB_OFFLINE=1) and the Hugging Face cache does not have it",
            prefix + "the Hub cannot be reached (Connection refused)",
        )
    ), str(caught.value)


def test_upload_commits_exactly_the_output(hub, api, baked):
    publish(baked, "acme/tiny", api, private=True)
    create = next(r for r in hub.requests if r[1] == "/api/repos/create")
    assert create[3] == f"Bearer {TOKEN}" and hub.repos["acme/tiny"]["private"]
    local = {p.name: p.read_bytes() for p in baked.iterdir()}
    assert set(local) >= {"README.md", "moebake.json", "model.safetensors.index.json", "config.json"}
    shards = {name for name in local if name.endswith(".safetensors")}
    uploaded = {r[1].rsplit("/", 1)[1] for r in hub.requests if r[0] == "PUT"}
    assert uploaded == {hashlib.sha256(local[name]).hexdigest() for name in shards}
    (commit,) = hub.commits
    assert commit["ref"] == "main" and commit["header"]["summary"] == "moebake sm90-cutlass bake of gpt-oss-tiny"
    by_path = {op["value"]["path"]: op for op in commit["operations"]}
    assert set(by_path) == set(local)
    for name, op in by_path.items():
        if name in shards:
            assert op["key"] == "lfsFile" and op["value"]["oid"] == hashlib.sha256(local[name]).hexdigest()
            assert op["value"]["size"] == len(local[name])
        else:
            assert op["key"] == "file" and base64.b64decode(op["value"]["content"]) == local[name]
    assert hub.head("acme/tiny") == {**local, ".gitattributes": hub.head("acme/tiny")[".gitattributes"]}


def test_an_interrupted_upload_resumes_and_a_finished_one_is_a_no_op(hub, api, baked):
    hub.fail_next_commit = True
    with pytest.raises(MoebakeError, match="re-run the same command to resume"):
        publish(baked, "acme/tiny", api)
    puts_before = sum(r[0] == "PUT" for r in hub.requests)
    assert puts_before == 2 and hub.commits == []
    publish(baked, "acme/tiny", api)
    assert sum(r[0] == "PUT" for r in hub.requests) == puts_before  # LFS objects are not sent again
    assert len(hub.commits) == 1
    publish(baked, "acme/tiny", api)
    assert len(hub.commits) == 1 and sum(r[0] == "PUT" for r in hub.requests) == puts_before


def test_upload_to_a_new_branch_and_as_a_pull_request(hub, api, baked):
    publish(baked, "acme/tiny", api, revision="layout-v2")
    assert hub.commits[-1]["ref"] == "layout-v2" and "README.md" not in hub.head("acme/tiny", "main")
    commit = publish(baked, "acme/tiny", api, create_pr=True)
    assert hub.commits[-1]["ref"] == "refs/pr/1" and commit.pr_url.endswith("/acme/tiny/discussions/1")
    assert any(r[1] == "/api/models/acme/tiny/commit/main" and r[2] == {"create_pr": "1"} for r in hub.requests)


def source_repo_files(tmp_path) -> dict[str, bytes]:
    """A tiny GPT-OSS repo laid out like openai/gpt-oss-20b, with files a conversion does not need."""
    src = write_gpt_oss(tmp_path / "hub-src", **TINY)
    files = {p.name: p.read_bytes() for p in src.iterdir()}
    files.update(
        {
            "README.md": b"---\nlicense: apache-2.0\n---\n# tiny\n",
            "LICENSE": b"Apache-2.0\n",
            "original/model.safetensors": files["model-00001-of-00002.safetensors"],
            "original/config.json": b"{}",
            "metal/model.bin": b"\0" * 64,
        }
    )
    return files


def test_a_hub_source_downloads_only_what_a_conversion_needs(hub, api, tmp_path):
    files = source_repo_files(tmp_path)
    sha = hub.add_repo("openai/gpt-oss-tiny", files)
    resolved = resolve_source("openai/gpt-oss-tiny@main", api)
    assert (resolved.repo_id, resolved.revision) == ("openai/gpt-oss-tiny", sha)
    fetched = {r[1].split(f"/resolve/{sha}/", 1)[1] for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]}
    needed = {name for name in files if "/" not in name and name != "README.md"}
    assert fetched == needed
    assert {p.name: p.read_bytes() for p in resolved.path.iterdir()} == {name: files[name] for name in needed}


def test_a_missing_revision_is_one_line(hub, api, tmp_path):
    hub.add_repo("openai/gpt-oss-tiny", source_repo_files(tmp_path))
    with pytest.raises(MoebakeError) as caught:
        resolve_source("openai/gpt-oss-tiny@no-such-branch", api)
    assert str(caught.value) == "openai/gpt-oss-tiny@no-such-branch: not a local folder, and the Hub repo has no such revision"


def test_convert_from_the_hub_upload_download_and_verify(hub, api, tmp_path, monkeypatch):
    sha = hub.add_repo("openai/gpt-oss-tiny", source_repo_files(tmp_path))
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: api)
    out = tmp_path / "baked"
    runner = CliRunner()
    result = runner.invoke(main, ["convert", "openai/gpt-oss-tiny", str(out), "--target", "sm90-cutlass", "--quiet"])
    assert result.exit_code == 0, result.output
    source = json.loads((out / "moebake.json").read_text())["source"]
    assert (source["location"], source["revision"]) == ("openai/gpt-oss-tiny", sha)
    result = runner.invoke(
        main, ["upload", str(out), "--repo-id", "acme/gpt-oss-tiny-sm90", "--source", "openai/gpt-oss-tiny", "--token", TOKEN]
    )
    assert result.exit_code == 0, result.output
    card = hub.head("acme/gpt-oss-tiny-sm90")["README.md"].decode()
    assert "base_model: openai/gpt-oss-tiny\n" in card and "base_model_relation: quantized\n" in card
    assert "license: apache-2.0\n" not in card  # the source card (README.md) was not downloaded, so not carried
    downloaded = api.snapshot_download("acme/gpt-oss-tiny-sm90")
    assert (Path(downloaded) / ".gitattributes").is_file()  # added by the Hub; verify tolerates it
    result = runner.invoke(main, ["verify", downloaded, "--source", f"openai/gpt-oss-tiny@{sha}", "--quiet"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("manifest_has_path", [False, True], ids=["new bake", "bake whose manifest holds its source path"])
def test_upload_sends_no_local_path_user_or_host_name(hub, api, gpt_oss_tiny, tmp_path, manifest_has_path):
    """Issue 37: every file ``upload`` sends is free of the local paths (source, OUT, home), and of the user's and
    the host's names; a manifest written by an older moebake, which held the source's absolute path, included."""
    import getpass
    import shutil
    import socket

    source = shutil.copytree(gpt_oss_tiny, tmp_path / "home" / "alice-private" / "models" / "gpt-oss-tiny")
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    convert(source, out, ConvertOptions("sm90-cutlass"), progress=False)
    if manifest_has_path:  # as moebake wrote it before (its self-checksum over the path)
        from moebake.schema.manifest import SELF_CHECKSUM_KEY, render_manifest

        manifest = json.loads((out / "moebake.json").read_text())
        manifest["source"]["location"] = str(source)
        del manifest[SELF_CHECKSUM_KEY]
        (out / "moebake.json").write_text(render_manifest(manifest))
    publish(out, "acme/tiny", api)
    sent = hub.head("acme/tiny")
    assert {"moebake.json", "README.md", "config.json"} <= set(sent)
    private = [str(tmp_path), "alice-private", str(Path.home())]
    words = [getpass.getuser(), socket.gethostname()]
    for name, data in sent.items():
        for text in private:
            assert text.encode() not in data, (name, text)
        if not name.endswith(".safetensors"):
            for word in words:
                assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", data.decode()), (name, word)
    assert json.loads(sent["moebake.json"])["source"]["location"] == "gpt-oss-tiny"
    assert json.loads((out / "moebake.json").read_text()) == json.loads(sent["moebake.json"])  # OUT holds what was sent
