"""``python -m atlas_cli``: the ``atlas`` command."""

import sys

from atlas_cli.main import main

sys.exit(main())
