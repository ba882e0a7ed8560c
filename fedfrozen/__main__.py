"""`python -m fedfrozen` is the `fedfrozen` command."""

import sys

from .cli import main

sys.exit(main())
