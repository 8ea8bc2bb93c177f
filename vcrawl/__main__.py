"""``python -m vcrawl``: the same as the ``vcrawl`` command."""

import sys

from vcrawl.cli import main

if __name__ == "__main__":
    sys.exit(main())
