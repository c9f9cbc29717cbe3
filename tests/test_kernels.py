"""Compiled kernels shipped with a bake: harvest -> add -> verify -> install -> uninstall, on CPU, into temporary folders.

The caches are made-up files in the folders FlashInfer, SGLang (tvm-ffi) and Triton write; the environment is this
Python's installed distributions, with Triton 3.6.0, apache-tvm-ffi 0.1.11 and CUDA 13.0 stood in for (the CPU torch has
neither Triton nor CUDA), the GPU architecture given.
"""

import json
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.verify import verify_report
from moebake.kernels import environment
from moebake.kernels.harvest import harvest
from moebake.kernels.locations import LEDGER
from moebake.kernels.record import kernel_sets
from moebake.schema.manifest import MANIFEST_NAME, read_manifest

TVM_DIR = "sgl_kernel_jit_fused_rope_abc__arch_9.0a__tvmffi_0.1.11"


STOOD_IN = {"triton": "3.6.0", "apache-tvm-ffi": "0.1.11"}


@pytest.fixture(autouse=True)
def gpu_stack(monkeypatch):
    real = environment.distribution_version
    monkeypatch.setattr(environment, "torch_cuda_version", lambda: "13.0")
    monkeypatch.setattr(environment, "distribution_version", lambda names: STOOD_IN.get(names[0]) or real(names))


@pytest.fixture()
def baked(gpt_oss_tiny, tmp_path):
    out = tmp_path / "bake"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    return out


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture()
def caches(tmp_path):
    """Cache folders as a first server start leaves them (with build files that are not harvested)."""
    root = tmp_path / "caches"
    flashinfer = environment.installed_versions()["flashinfer"]
    ops = root / "flashinfer" / ".cache" / "flashinfer" / flashinfer / "90a" / "cached_ops"
    write(ops / "norm" / "norm.so", b"\x7fELF norm module")
    write(ops / "norm" / "norm.cuda.o", b"object")
    write(ops / "norm" / "build.ninja", b"rule")
    write(root / "tvm-ffi" / TVM_DIR / "sgl_kernel_jit_fused_rope_abc.so", b"\x7fELF rope")
    write(root / "tvm-ffi" / TVM_DIR / "main.o", b"object")
    write(root / "triton" / "HASH1" / "_fwd_kernel.cubin", b"cubin bytes")
    write(root / "triton" / "HASH1" / "_fwd_kernel.json", b'{"name": "_fwd_kernel"}')
    write(root / "triton" / "tmp.pid_1_2" / "partial.cubin", b"half")
    return {"flashinfer": root / "flashinfer" / ".cache" / "flashinfer", "tvm-ffi": root / "tvm-ffi", "triton": root / "triton"}


def installed_roots(tmp_path) -> dict[str, Path]:
    base = tmp_path / "node"
    return {
        "flashinfer": base / "aot",
        "tvm-ffi": base / "tvm-ffi",
        "triton": base / "triton",
        "deep-gemm": base / "deep_gemm",
        "tilelang": base / "tilelang",
        "flashinfer-cubins": base / "cubins",
    }


def root_options(roots: dict[str, Path]) -> list[str]:
    return [arg for kind, folder in roots.items() for arg in ("--root", f"{kind}={folder}")]


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def harvested(tmp_path, caches) -> Path:
    out = tmp_path / "harvest"
    harvest(out, "sglang", "sm90", env={"HOME": str(tmp_path / "home")}, roots=caches)
    return out


def placed_files(roots: dict[str, Path]) -> list[str]:
    return sorted(str(p) for folder in roots.values() if folder.exists() for p in folder.rglob("*") if p.is_file())


def test_harvest_copies_the_modules_not_the_build_files(tmp_path, caches):
    out = harvested(tmp_path, caches)
    meta = json.loads((out / "harvest.json").read_text())
    assert sorted(meta["files"]) == [
        "flashinfer/norm/norm.so",
        "triton/HASH1/_fwd_kernel.cubin",
        "triton/HASH1/_fwd_kernel.json",
        f"tvm-ffi/{TVM_DIR}/sgl_kernel_jit_fused_rope_abc.so",
    ]
    assert meta["engine"] == "sglang" and meta["release"] == environment.engine_release("sglang") and meta["arch"] == "sm90"
    assert meta["versions"]["cuda"] == "13.0" and meta["versions"]["torch"] == environment.installed_versions()["torch"]
    assert (out / "flashinfer/norm/norm.so").read_bytes() == b"\x7fELF norm module"
    with pytest.raises(Exception, match="exists"):
        harvest(out, "sglang", "sm90", env={"HOME": str(tmp_path / "home")}, roots=caches)


def test_round_trip_add_verify_install_uninstall(tmp_path, baked, caches):
    source = harvested(tmp_path, caches)
    config_before = (baked / "config.json").read_bytes()
    done = run("kernels", "add", baked, "--from", source)
    assert done.exit_code == 0, done.output
    release = environment.engine_release("sglang")
    identifier = f"sglang-{release}-sm90"
    assert f"added kernel set {identifier}" in done.output
    [kernel_set] = kernel_sets(read_manifest(baked), baked)
    assert kernel_set.id == identifier and len(kernel_set.files) == 4
    assert (baked / "kernels" / identifier / "flashinfer/norm/norm.so").read_bytes() == b"\x7fELF norm module"
    assert (baked / "config.json").read_bytes() == config_before  # the bake digest leaves the kernels out

    report = verify_report(baked)
    assert report.problems == [] and report.kernel_files == 4
    verified = run("verify", baked, "--quiet")
    assert verified.exit_code == 0 and "4 kernel files" in verified.output, verified.output
    shown = run("inspect", baked)
    assert shown.exit_code == 0 and f"kernels        {identifier}: 4 files" in shown.output, shown.output

    roots = installed_roots(tmp_path)
    dry = run("kernels", "install", baked, "--arch", "sm90", "--dry-run", *root_options(roots))
    assert dry.exit_code == 0 and "would place" in dry.output and placed_files(roots) == [], dry.output
    done = run("kernels", "install", baked, "--arch", "sm90", *root_options(roots))
    assert done.exit_code == 0, done.output
    assert "flashinfer: placed 1 file" in done.output and "triton: placed 2 files" in done.output
    assert (roots["flashinfer"] / "norm/norm.so").read_bytes() == b"\x7fELF norm module"
    assert (roots["tvm-ffi"] / TVM_DIR / "sgl_kernel_jit_fused_rope_abc.so").read_bytes() == b"\x7fELF rope"
    assert (roots["triton"] / "HASH1/_fwd_kernel.cubin").read_bytes() == b"cubin bytes"
    ledger = json.loads((roots["triton"] / LEDGER).read_text())
    assert set(ledger["files"]) == {"HASH1/_fwd_kernel.cubin", "HASH1/_fwd_kernel.json"}
    again = run("kernels", "install", baked, "--arch", "sm90", *root_options(roots))
    assert again.exit_code == 0 and "placed 0 files" in again.output and "already there" in again.output, again.output

    removed = run("kernels", "uninstall", baked, *root_options(roots))
    assert removed.exit_code == 0 and "removed 4 kernel files" in removed.output, removed.output
    assert placed_files(roots) == []


def test_a_changed_byte_is_refused_by_verify_and_install(tmp_path, baked, caches):
    assert run("kernels", "add", baked, "--from", harvested(tmp_path, caches)).exit_code == 0
    [kernel_set] = kernel_sets(read_manifest(baked), baked)
    victim = baked / "kernels" / kernel_set.id / "triton/HASH1/_fwd_kernel.cubin"
    data = bytearray(victim.read_bytes())
    data[3] ^= 1
    victim.write_bytes(bytes(data))
    verified = run("verify", baked, "--quiet")
    assert verified.exit_code == 1 and "_fwd_kernel.cubin: sha256" in verified.output, verified.output
    roots = installed_roots(tmp_path)
    done = run("kernels", "install", baked, "--arch", "sm90", *root_options(roots))
    assert done.exit_code == 2, done.output
    [line] = done.output.strip().splitlines()
    assert line.startswith("error: ") and "_fwd_kernel.cubin" in line and "compiles its kernels as usual" in line
    assert placed_files(roots) == []


@pytest.mark.parametrize(
    "option, field", [(("--arch", "sm100"), "GPU architecture expected sm90, found sm100"), ((), "flashinfer expected 0.0.0, found")]
)
def test_a_version_or_architecture_mismatch_places_nothing(tmp_path, baked, caches, option, field):
    source = harvested(tmp_path, caches)
    (source / "harvest.json").unlink()  # versions given instead
    versions = environment.installed_versions()
    given = [
        "--engine",
        f"sglang=={environment.engine_release('sglang')}",
        "--arch",
        "sm90",
        "--torch",
        versions["torch"],
        "--cuda",
        "13.0",
        "--tvm-ffi",
        "0.1.11",
        "--triton",
        "3.6.0",
        "--flashinfer",
        versions["flashinfer"] if option else "0.0.0",
    ]
    done = run("kernels", "add", baked, "--from", source, *given)
    assert done.exit_code == 0, done.output
    roots = installed_roots(tmp_path)
    done = run("kernels", "install", baked, *(option or ("--arch", "sm90")), *root_options(roots))
    assert done.exit_code == 2
    [line] = done.output.strip().splitlines()
    assert line.startswith("error: ") and field in line and "nothing installed" in line, line
    assert placed_files(roots) == []


def test_install_never_overwrites_a_file_moebake_did_not_place(tmp_path, baked, caches):
    assert run("kernels", "add", baked, "--from", harvested(tmp_path, caches)).exit_code == 0
    roots = installed_roots(tmp_path)
    foreign = write(roots["tvm-ffi"] / TVM_DIR / "sgl_kernel_jit_fused_rope_abc.so", b"someone else's build")
    done = run("kernels", "install", baked, "--arch", "sm90", *root_options(roots))
    assert done.exit_code == 2 and "moebake did not place it there" in done.output, done.output
    assert foreign.read_bytes() == b"someone else's build"
    assert placed_files(roots) == [str(foreign)]


def test_install_replaces_its_own_files_only_while_unchanged(tmp_path, baked, caches):
    assert run("kernels", "add", baked, "--from", harvested(tmp_path, caches)).exit_code == 0
    roots = installed_roots(tmp_path)
    assert run("kernels", "install", baked, "--arch", "sm90", *root_options(roots)).exit_code == 0
    ours = roots["triton"] / "HASH1/_fwd_kernel.json"
    ours.write_bytes(b"edited by hand")  # no longer what moebake placed: left alone
    done = run("kernels", "install", baked, "--arch", "sm90", *root_options(roots))
    assert done.exit_code == 2 and ours.read_bytes() == b"edited by hand", done.output
    removed = run("kernels", "uninstall", baked, *root_options(roots))
    assert "left " in removed.output and ours.read_bytes() == b"edited by hand"


def test_a_failed_add_leaves_the_bake_as_it_was(tmp_path, baked, caches):
    source = harvested(tmp_path, caches)
    meta = json.loads((source / "harvest.json").read_text())
    meta["files"]["triton/HASH1/_fwd_kernel.json"]["sha256"] = "0" * 64
    (source / "harvest.json").write_text(json.dumps(meta))
    before = {p.relative_to(baked): p.read_bytes() for p in baked.rglob("*") if p.is_file()}
    done = run("kernels", "add", baked, "--from", source)
    assert done.exit_code == 2 and done.output.startswith("error: ") and "_fwd_kernel.json" in done.output, done.output
    assert {p.relative_to(baked): p.read_bytes() for p in baked.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in baked.iterdir() if p.is_dir()) == []


def test_bad_sources_are_one_error_line(tmp_path, baked, caches):
    source = harvested(tmp_path, caches)
    write(source / "mystery" / "x.bin", b"?")
    done = run("kernels", "add", baked, "--from", source)
    assert done.exit_code == 2 and "mystery/x.bin" in done.output and len(done.output.strip().splitlines()) == 1
    no_harvest = tmp_path / "bare"
    write(no_harvest / "triton" / "a.cubin", b"x")
    done = run("kernels", "add", baked, "--from", no_harvest)
    assert done.exit_code == 2 and "--engine" in done.output, done.output
    done = run("kernels", "install", baked, "--arch", "sm90")
    assert done.exit_code == 2 and "holds no kernels" in done.output, done.output


def test_reduced_module_goes_in_with_its_sidecar_checked(tmp_path, baked):
    from moebake.kernels.files import sha256_file

    versions = environment.installed_versions()
    module = write(tmp_path / "module" / "fused_moe_90_moebake.so", b"\x7fELF reduced module")
    sidecar = {
        "module": "fused_moe_90_moebake",
        "flashinfer": versions["flashinfer"],
        "tvm_ffi": "0.1.11",
        "arch": "sm_90a",
        "sha256": sha256_file(module)[0],
    }
    module.with_suffix(".json").write_text(json.dumps(sidecar))
    given = [
        "--engine",
        f"sglang=={environment.engine_release('sglang')}",
        "--arch",
        "sm90",
        "--torch",
        versions["torch"],
        "--cuda",
        "13.0",
    ]
    done = run("kernels", "add", baked, "--reduced-module", module, *given)
    assert done.exit_code == 0, done.output
    [kernel_set] = kernel_sets(read_manifest(baked), baked)
    assert sorted(kernel_set.files) == [
        "flashinfer/fused_moe_90_moebake/fused_moe_90_moebake.json",
        "flashinfer/fused_moe_90_moebake/fused_moe_90_moebake.so",
    ]
    assert kernel_set.versions["flashinfer"] == versions["flashinfer"] and kernel_set.versions["tvm_ffi"] == "0.1.11"
    module.write_bytes(b"\x7fELF other bytes")
    done = run("kernels", "add", baked, "--reduced-module", module, "--replace", *given)
    assert done.exit_code == 2 and "its record says" in done.output, done.output


def test_upload_carries_the_kernels(tmp_path, baked, caches):
    from moebake.hub.publish import publish

    assert run("kernels", "add", baked, "--from", harvested(tmp_path, caches)).exit_code == 0

    class Hub:
        def create_repo(self, repo_id, *, private, exist_ok):
            pass

        def upload_folder(self, *, repo_id, folder_path, commit_message, revision, create_pr):
            folder = Path(folder_path)
            self.uploaded = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
            return types.SimpleNamespace(commit_url="https://hub.test/c", pr_url=None)

    hub = Hub()
    publish(baked, "acme/bake", hub)
    [kernel_set] = kernel_sets(read_manifest(baked), baked)
    for rel in kernel_set.files:
        path = f"kernels/{kernel_set.id}/{rel}"
        assert hub.uploaded[path] == (baked / path).read_bytes()
    assert MANIFEST_NAME in hub.uploaded and "config.json" in hub.uploaded
