"""The repository speaks of moebake alone: no tracked text narrates how the work was carried out (the order of GPU
runs, what was copied to the GPU host in which step, how much machine time was left) or names the paths of one
particular machine. Such notes belong in commit messages, never in docs, code, generated reports or results."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

ORDINAL = r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|another|later|earlier"
ORDINAL += r"|previous|next|last)"
DETERMINER = r"(same|that|this|each|one|other|a|the)"
NARRATION = re.compile(
    "|".join(
        [
            rf"\b{ORDINAL} (GPU )?(session|hold)s?\b",  # "the sixth hold", "a later session"
            rf"\b{DETERMINER} (GPU )?(session|hold)(?!s? (it|one|the|a|its|them|every|of its own)\b)(?=[\s,.;:)'])",  # "in one hold,"
            r"\bGPU sessions?\b",
            r"\bdevice[- ](minutes?|calls?|tool)\b",
            r"\b[Cc]alls? \d+\b(?! s\b)",  # "call 1, carry [...]", not "call 10 s later"
            r"\bcarr(y|ied|ying) \[",
            r"\bgive_back\b",
            r"\bhelper-\d",
            r"\bgpu-sessions\b",
            r"(?<![\w.])/wor" r"k/",  # one machine's checkout (split: this file's text must not match it)
            r"(?<![\w.])/root/",
            r"(?<![\w.])/home/[a-z]",
        ]
    ),
    re.IGNORECASE,
)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    files = []
    for raw in names:
        if not raw or raw.decode() == THIS:
            continue
        path = REPO / raw.decode()
        if path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def test_no_tracked_text_narrates_how_the_work_was_done():
    hits = []
    for path in tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found = NARRATION.search(line)
            if found:
                hits.append(f"{path.relative_to(REPO)}:{number}: {found.group(0)!r}")
    assert hits == [], f"{len(hits)} lines narrate the work or name a machine's paths:\n" + "\n".join(hits[:60])


def test_the_pattern_catches_what_it_is_for():
    # the examples are split so that this file's own text does not match the patterns it holds
    for text in (
        "measured in the six" + "th hold",
        "a later session found",
        "device, call 1, car" + 'ry [".whl"]',
        "S17_WHEELS=/wor" + "k/main/.whl-s17",
        "the last 5 device" + "-minutes",
        "measured in one hold, then",
    ):
        assert NARRATION.search(text), text
    for text in (
        "the manifest holds every tensor",
        "a folder that holds a clone",
        "the same holds for vLLM",
        "each perf_counter call 10 s later",
        "moebake.serve holds one rank",
    ):
        assert not NARRATION.search(text), text
