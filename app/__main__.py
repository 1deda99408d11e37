"""`python -m app`: the desktop app without the `rigllm` console script."""

import sys

from app.main import main

sys.exit(main())
