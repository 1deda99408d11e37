"""Entry of the bundle's `rigllm` executable: the same CLI as the console script (`rigllm gui`, `serve`, ...)."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
