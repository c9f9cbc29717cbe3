"""What a user installs: the license, and the two sizes of bin/setup (light for bin/demo, full for bin/test)."""

import hashlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_the_apache_2_0_text_pyproject_names():
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_bytes()
    # the canonical https://www.apache.org/licenses/LICENSE-2.0.txt
    assert hashlib.md5(text).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"
    assert b"Apache License\n                           Version 2.0, January 2004" in text
