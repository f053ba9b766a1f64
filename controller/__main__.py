"""``python -m controller`` runs the controller daemon (``lightrail controller``)."""

import sys

from lightrail.controller.cli.main import main

sys.exit(main(["controller", *sys.argv[1:]]))
