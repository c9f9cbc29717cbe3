"""bin/gpu-wheels --sglang-split: SGLang's wheel set cut in two carries, run on stand-in wheels (sparse files of the
real sizes' order: the script reads names and sizes only)."""

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def test_sglang_split_leaves_sglang_and_at_most_the_carry_limit_in_the_second_call(tmp_path):
    (tmp_path / "bin").mkdir()
    shutil.copy(REPO / "bin" / "gpu-wheels", tmp_path / "bin" / "gpu-wheels")
    first, second = tmp_path / ".whl-sglang", tmp_path / ".whl-sglang-2"
    first.mkdir()
    second.mkdir()
    sizes = {
        "sglang-0.5.23-py3-none-any.whl": 19,
        "transformers-5.20.2-py3-none-any.whl": 13,
        "jedi-0.20.1-py3-none-any.whl": 5,
        "tokenizers-0.23.3-cp310-abi3-manylinux.whl": 3,
        "openai-3.57.0-py3-none-any.whl": 2,
    }
    sizes.update({f"small{i}-1.0-py3-none-any.whl": 1 for i in range(20)})  # 62 MiB in all
    for name, mib in sizes.items():
        with open(first / name, "wb") as wheel:
            wheel.truncate(mib * MIB)
    (second / "old-1.0-py3-none-any.whl").write_bytes(b"x")  # an earlier split's: back in the set, then split again
    done = subprocess.run(["bash", str(tmp_path / "bin" / "gpu-wheels"), "--sglang-split"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kept = {p.name: p.stat().st_size for p in first.iterdir()}
    moved = {p.name for p in second.iterdir()}
    assert "sglang-0.5.23-py3-none-any.whl" in kept and sum(kept.values()) <= 50 * MIB
    assert moved == {"transformers-5.20.2-py3-none-any.whl"}  # the largest other wheel was enough
    assert set(kept) | moved == set(sizes) | {"old-1.0-py3-none-any.whl"}
    assert "carry .whl-sglang-2" in done.stdout
