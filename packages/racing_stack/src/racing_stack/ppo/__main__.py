"""``python -m racing_stack.ppo``: `racing_stack.ppo.cli.main`."""

import sys

from racing_stack.ppo.cli import main

sys.exit(main())
