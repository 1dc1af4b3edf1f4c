"""`python -m prefdata ...` (and `torchrun -m prefdata refs ...`)."""

import sys

try:
    from prefdata.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: exit 130 with one line, no traceback
    print("prefdata: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
