"""Entry point of the frozen (PyInstaller) app: the same `quantscope` command line, GUI by default."""

import sys

from quantscope.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
