"""`python -m voxpipe`: the same CLI as the `voxpipe` command."""

import sys

from voxpipe.cli import main

sys.exit(main())
