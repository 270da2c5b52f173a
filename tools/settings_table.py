"""Write docs/configuration.md's settings table from the settings table (libshare/settings.py).

    .venv/bin/python tools/settings_table.py            # rewrite the table between the markers
    .venv/bin/python tools/settings_table.py --print    # print it

tests/test_settings.py fails when the document's table is not the one this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from libshare import settings  # noqa: E402

DOCUMENT = ROOT / "docs" / "configuration.md"


def main(argv: list[str]) -> int:
    if argv == ["--print"]:
        print(settings.markdown())
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    DOCUMENT.write_text(settings.update_markdown(DOCUMENT.read_text()))
    print(f"wrote the settings table of {DOCUMENT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
