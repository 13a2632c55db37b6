"""``python -m recordkit`` is the ``recordkit`` command."""

import sys

from .cli import main

sys.exit(main())
