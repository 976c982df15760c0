"""``make mutation-check``: the faults of tests/mutants.py, one at a time.

Each fault goes into a copy of the package (the worktree is never changed) and the tests
it names run against it; the report says which faults the tests killed and which
survived, and how long it took. ``--list`` lists the faults, ``--only NAME`` runs one.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mutants import main

if __name__ == "__main__":
    sys.exit(main())
