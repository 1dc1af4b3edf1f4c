"""`python -m prefdata ...` (and `torchrun -m prefdata refs ...`)."""

import sys

from prefdata.cli import main

sys.exit(main())
