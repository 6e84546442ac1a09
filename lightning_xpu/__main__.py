"""``python -m lightning_xpu``: the ``lightning-xpu`` command line."""

import sys

from lightning_xpu.cli import main

sys.exit(main())
