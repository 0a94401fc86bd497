"""``python -m experiments.campaign``: :func:`experiments.campaign.cli.main`."""

import sys

from experiments.campaign.cli import main

sys.exit(main())
