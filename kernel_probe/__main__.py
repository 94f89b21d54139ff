import sys

from kernel_probe.cli import main

sys.exit(main())
