"""Integrity check of a baked output directory: manifest, checksums, index, shard headers.

What plain ``verify`` proves (without the source): ``moebake.json`` is exactly as moebake wrote it
(its own checksum over every field, its exact bytes, the fields readers rely on of the right type);
every file it lists has the recorded size and checksum, and no other file is there; the index maps
every tensor to the shard that holds it and its ``total_size`` is right; every shard header is valid
safetensors; every baked tensor the layer records name is in the index with the recorded dtype and
shape; the compiled kernels a bake carries under ``kernels/`` have the recorded sizes and sha256
(:func:`moebake.kernels.pack.verify_kernels`). ``verify --source`` adds bit-exactness against the source
(:mod:`moebake.convert.source_check`).
"""

from dataclasses import dataclass, field
from pathlib import Path

from moebake.errors import CheckpointError, MoebakeError
from moebake.formats.safetensors_file import SafetensorsFile, read_header
from moebake.kernels.pack import verify_kernels
from moebake.kernels.record import FOLDER as KERNELS_FOLDER
from moebake.progress_bars import byte_bar, shard_done, size_text
from moebake.schema.checksums import checksum_problem
from moebake.schema.config_json import config_problems
from moebake.schema.files import file_kind, plain_name_problem
from moebake.schema.index import SAFETENSORS_INDEX_FILE, SHARD_SUFFIX, read_index
from moebake.schema.manifest import MANIFEST_NAME, Manifest, load_manifest

HUB_ADDED = {".gitattributes", ".cache"}
"""What a Hub repo or ``hf download --local-dir`` adds beside the files of a downloaded output."""


@dataclass
class VerifyReport:
    """Problems found (one line each) and what was checked, for the ``ok:`` line."""

    problems: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    shards: int = 0
    tensors: int = 0
    kernel_files: int = 0
    kernel_bytes: int = 0

    def summary(self) -> str:
        kernels = f"; {self.kernel_files} kernel files, {size_text(self.kernel_bytes)} match their sha256" if self.kernel_files else ""
        return (
            f"{MANIFEST_NAME} intact; {self.files} files, {size_text(self.bytes)} match their checksums; "
            f"index and {self.shards} shard headers valid; {self.tensors} baked tensors as recorded{kernels}"
        )


def verify_output(out: str | Path) -> list[str]:
    """Problems found in ``out`` (empty when every check passes). Each problem is one line."""
    return verify_report(out).problems


def verify_report(out: str | Path, progress: bool = False) -> VerifyReport:
    """Check ``out`` (module docstring); a changed manifest is reported alone (its records are not trusted)."""
    out = Path(out)
    raw, problems = load_manifest(out)
    report = VerifyReport(problems)
    if problems:
        return report
    manifest = Manifest.from_json(raw, out / MANIFEST_NAME)  # intact: its typed records
    files = manifest.files
    absent = set()  # listed files that are missing or not regular files: reported once, here, and not read again below
    intact = set()  # listed files of the recorded size and checksum
    with byte_bar(sum(r.bytes for r in files.values()), "verifying", enabled=progress, shards=len(files), what="file") as bar:
        for name, record in files.items():
            path = out / name
            if (problem := plain_name_problem(name)) is not None:
                problems.append(f"{out / MANIFEST_NAME}: lists {name!r}, which is not a plain file name ({problem})")
            elif not path.exists():
                problems.append(f"{path}: listed in {MANIFEST_NAME} but missing")
                absent.add(name)
            elif not path.is_file():
                problems.append(f"{path}: is {file_kind(path.stat().st_mode)}, not a regular file")
                absent.add(name)
            elif path.stat().st_size != record.bytes:
                problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {record.bytes}")
            elif problem := checksum_problem(path, record.to_json()):
                problems.append(problem)
            else:
                intact.add(name)
                report.files += 1
                report.bytes += record.bytes
            bar.update(record.bytes)
            shard_done(bar, name, record.bytes, "checked", "file")
    headers, unread, index_problems = _check_index(out, absent, set(files), set(files) - intact)
    problems += index_problems
    report.shards = len(headers)
    problems += _check_layer_records(out, manifest, headers, unread, report)
    if manifest.engine is not None:  # bakes from before engine profiles kept the source's config.json
        problems += config_problems(out, raw)
    kernel_problems, report.kernel_files, report.kernel_bytes = verify_kernels(out, raw)
    problems += kernel_problems
    listed = set(files) | {MANIFEST_NAME, KERNELS_FOLDER} | HUB_ADDED  # kernels/: checked by verify_kernels
    problems += [f"{p}: not listed in {MANIFEST_NAME}" for p in sorted(out.iterdir()) if p.name not in listed]
    return report


def _check_layer_records(
    out: Path, manifest: Manifest, headers: dict[str, SafetensorsFile], unread: set[str] | None, report: VerifyReport
) -> list[str]:
    """Every baked tensor a layer record names is stored with the record's dtype and shape (those the index puts in
    an ``unread`` shard, already reported missing, aside; ``unread`` None: a shard is missing and no index says what it
    held, so a tensor no header holds is not reported again)."""
    stored = {name: (header, entry) for header in headers.values() for name, entry in header.tensors.items()}
    problems = []
    for layer in manifest.layers:
        for short, spec in layer.tensors.items():
            name = layer.prefix + short
            if unread is not None and name in unread:
                continue
            if name not in stored:
                if unread is None:
                    continue
                problems.append(f"{out / MANIFEST_NAME}: layer {layer.prefix} records tensor {name}, which no shard holds")
                continue
            header, entry = stored[name]
            if (spec.dtype, spec.shape) != (entry.dtype, tuple(entry.shape)):
                problems.append(
                    f"{header.path}: tensor {name} is {entry.dtype} {list(entry.shape)}, "
                    f"{MANIFEST_NAME} records {spec.dtype} {list(spec.shape)}"
                )
            else:
                report.tensors += 1
    return problems


def _check_index(
    out: Path, absent: set[str], listed: set[str], reported: set[str]
) -> tuple[dict[str, SafetensorsFile], set[str] | None, list[str]]:
    """The shard headers the index names, the tensors it maps to ``absent`` shards (already reported, not read),
    and problems with the index or the headers. Without a readable index: the headers of the shards the manifest
    lists (``listed``), so that the layer records are still checked and an intact shard's tensors are not reported
    missing; an index already ``reported`` (missing, or not the recorded bytes) is not reported again."""
    try:
        index = read_index(out)
    except CheckpointError as err:
        problems = [] if SAFETENSORS_INDEX_FILE in reported else [str(err)]
        headers = {}
        for shard_name in sorted(name for name in listed - absent if name.endswith(SHARD_SUFFIX)):
            try:
                headers[shard_name] = read_header(out / shard_name)
            except MoebakeError as header_err:
                problems.append(str(header_err))
        shard_missing = any(name.endswith(SHARD_SUFFIX) for name in absent)
        return headers, None if shard_missing else set(), problems
    index_path, total_size = index.path, index.total_size
    if total_size is None:
        return {}, set(), [f"{index_path}: metadata.total_size is missing"]
    problems, payload, headers, unread = [], 0, {}, set()
    for shard_name in index.shard_names:
        if shard_name in absent:
            unread |= index.tensors_of(shard_name)
            continue
        try:
            header = headers[shard_name] = read_header(out / shard_name)
        except MoebakeError as err:
            problems.append(str(err))
            continue
        if header.metadata.get("format") != "pt":
            problems.append(f'{out / shard_name}: __metadata__ lacks "format": "pt"')
        expected = index.tensors_of(shard_name)
        for tensor in sorted(expected - set(header.tensors)):
            problems.append(f"{index_path}: maps tensor {tensor} to {shard_name}, which does not contain it")
        for tensor in sorted(set(header.tensors) - expected):
            problems.append(f"{out / shard_name}: tensor {tensor} is not in the index")
        payload += sum(entry.nbytes for entry in header.tensors.values())
    if payload != total_size and not problems and not unread:
        problems.append(f"{index_path}: metadata.total_size is {total_size}, shards hold {payload} tensor bytes")
    return headers, unread, problems
