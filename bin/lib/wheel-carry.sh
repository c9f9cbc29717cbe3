# Shared by bin/gpu-sglang-stack and bin/gpu-vllm-stack (sourced, not run): an engine's serving stack carried to the
# GPU device machine as wheels, in pieces small enough for one call's 64 MiB carry each.
#   PIP_PLATFORM                      pip download's options for the device's Python 3.12 on x86-64 Linux
#   repack SRC OUT DROP [PARTS...]    a wheel less the files under DROP, optionally split into parts
#   split_into_pieces DEST LIMIT_MIB  DEST/all/*.whl -> DEST/1, DEST/2, ..., first-fit by size
#   pack_tree DEST ROOT               ROOT's committed tree (what the device runs) as DEST/tree.tar.gz
#   unpack_wheels SITE WHEEL...       wheels unpacked into SITE, as pip --target would

PIP_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64)

# repack SRC OUT DROP [PART_PREFIXES...]: SRC's files less those under DROP (comma-separated prefixes), RECORD
# rewritten. With PART_PREFIXES, OUT.part1.whl holds the files under the first (comma-separated) prefixes, part2 the
# next, ..., and the last part everything else with the RECORD; without, OUT is one wheel.
repack() {
  python3 - "$@" <<'PYEOF'
import base64, hashlib, sys, zipfile
from pathlib import Path

src, out, drop = Path(sys.argv[1]), Path(sys.argv[2]), tuple(p for p in sys.argv[3].split(",") if p)
parts = [tuple(p for p in arg.split(",") if p) for arg in sys.argv[4:]]

def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

names = [out] if not parts else [out.with_name(f"{out.name}.part{n}.whl") for n in range(1, len(parts) + 2)]
zouts = [zipfile.ZipFile(n, "w", zipfile.ZIP_DEFLATED, compresslevel=9) for n in names]
dropped = 0
with zipfile.ZipFile(src) as zin:
    record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    rows = []
    for info in zin.infolist():
        if info.filename == record_name:
            continue
        if info.filename.startswith(drop):
            dropped += 1
            continue
        data = zin.read(info)
        target = next((i for i, p in enumerate(parts) if info.filename.startswith(p)), len(zouts) - 1)
        zouts[target].writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        rows.append(f"{info.filename},{record_hash(data)},{len(data)}")
    rows.append(f"{record_name},,")
    zouts[-1].writestr(record_name, "\n".join(rows) + "\n")
for z in zouts:
    z.close()
print(f"{src.name}: {src.stat().st_size / 2**20:.1f} MiB -> "
      + " + ".join(f"{n.stat().st_size / 2**20:.1f}" for n in names) + f" MiB ({dropped} files dropped)")
PYEOF
}

split_into_pieces() {
  # First-fit by size, largest first, into pieces of at most LIMIT_MIB; a wheel over the limit stops it.
  python3 - "$1" "$2" <<'PYEOF'
import sys
from pathlib import Path

dest, limit = Path(sys.argv[1]), float(sys.argv[2]) * 2**20
pieces: list[list[Path]] = []
for wheel in sorted((dest / "all").glob("*.whl"), key=lambda p: -p.stat().st_size):
    size = wheel.stat().st_size
    if size > limit:
        sys.exit(f"{wheel.name}: {size / 2**20:.1f} MiB, over a piece's {limit / 2**20:.0f} MiB")
    for piece in pieces:
        if sum(w.stat().st_size for w in piece) + size <= limit:
            piece.append(wheel)
            break
    else:
        pieces.append([wheel])
for number, piece in enumerate(pieces, 1):
    folder = dest / str(number)
    folder.mkdir()
    for wheel in piece:
        wheel.rename(folder / wheel.name)
    print(f"piece {number}: {len(piece)} wheels, {sum(w.stat().st_size for w in folder.iterdir()) / 2**20:.1f} MiB")
(dest / "all").rmdir()
PYEOF
}

pack_tree() {
  local dest="$1" root="$2"
  mkdir -p "$dest"
  # What the device runs (moebake, the scripts, the GPU test), not the committed results and fixtures: small beside a piece.
  git -C "$root" archive --format=tar.gz -o "$dest/tree.tar.gz" HEAD moebake bin pyproject.toml \
    $(git -C "$root" ls-files 'bench/*.py' tests/gpu tests/conftest.py)
  echo "$dest/tree.tar.gz: $(git -C "$root" log --oneline -1), $(du -h "$dest/tree.tar.gz" | cut -f1)"
}

unpack_wheels() {
  local site="$1"; shift
  mkdir -p "$site"
  python3 - "$site" "$@" <<'PYEOF'
"""Unpack wheels (a repacked wheel's parts too) into a site folder, as pip --target would, without its checks."""
import shutil, sys, time, zipfile
from pathlib import Path

site, wheels = Path(sys.argv[1]), [Path(w) for w in sys.argv[2:] if Path(w).is_file()]
start = time.monotonic()
for wheel in wheels:
    stamp = site / ".unpacked" / wheel.name
    if stamp.exists():
        continue
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for data in site.glob("*.data"):            # purelib/platlib of a .data folder go to the site itself
        for sub in ("purelib", "platlib"):
            if (data / sub).is_dir():
                shutil.copytree(data / sub, site, dirs_exist_ok=True)
        shutil.rmtree(data)
    stamp.parent.mkdir(exist_ok=True)
    stamp.touch()
    print(f"unpacked {wheel.name}")
print(f"{len(wheels)} wheels in {time.monotonic() - start:.1f} s; {len(list((site / '.unpacked').glob('*.whl')))} unpacked in {site} so far")
PYEOF
}
