"""``python -m trajsft.cli``: the ``trajsft`` command."""

import sys

from . import main

sys.exit(main())
