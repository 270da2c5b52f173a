"""The documents for users: the README is a short front page whose test command is what CI runs,
and every relative link in the README and docs/ leads to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250
CI_MARKER = "# The README's test command, verbatim:"

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def readme_command(label: str) -> str:
    """The one-line command in the first fenced block after the README's bold ``label``."""
    text = README.read_text()
    start = text.index(f"**{label}**")
    block = re.search(r"```(?:sh|bash)?\n(.*?)```", text[start:], re.S)
    assert block, f"no code block after {label!r} in README.md"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, f"the README's {label!r} block should be one command line: {lines}"
    return lines[0].strip()


def ci_command() -> str:
    """The line of .ci/run that follows its marker: the command CI runs."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return lines[lines.index(CI_MARKER) + 1].strip()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: dict[str, int] = {}
    result = set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = found.get(base, 0)
            found[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(path: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", path.read_text()))


def test_the_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_ci_runs_the_readme_test_command():
    assert readme_command("Run the tests") == ci_command()


def test_the_readme_commands_set_up_through_the_script():
    """Both commands start from tools/setup.sh, which works as root (no sudo) and with sudo."""
    assert readme_command("Run the main job").startswith("sh tools/setup.sh && ")
    assert readme_command("Run the tests").startswith("sh tools/setup.sh test && ")
    assert (ROOT / "tools" / "setup.sh").is_file()


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_settings_table_has_its_markers():
    """docs/configuration.md holds the settings table between markers, for a generator to fill."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    begin, end = text.index("<!-- settings-table-begin -->"), text.index("<!-- settings-table-end -->")
    assert begin < end
