"""python -m vramledger run -- python app.py"""

import sys

from .cli import main

sys.exit(main())
