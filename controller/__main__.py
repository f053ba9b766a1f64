"""``python -m controller`` runs the controller daemon (``lightrail controller``)."""

import sys

from controller.cli import main

sys.exit(main(["controller", *sys.argv[1:]]))
