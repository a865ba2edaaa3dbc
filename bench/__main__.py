from __future__ import annotations

import sys

from bench._runner import main

sys.exit(main())
