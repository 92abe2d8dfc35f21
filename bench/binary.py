"""The forte binary every benchmark runs: this tree's release build, or the one FORTE_BINARY
names, so that another build (an earlier commit's, say) is timed by the same scripts."""

import os
from pathlib import Path

FORTE = Path(os.environ.get("FORTE_BINARY")
             or Path(__file__).resolve().parent.parent / "target" / "release" / "forte")
