"""The process's one Outpost, shared by every request and thread.

It reads POLAR_ACCESS_TOKEN, POLAR_SERVER_URL and REDIS_URL from the environment; OUTPOST_METER_ID
names the meter the views read balances from. Outpost starts its background work on first use.
"""

from __future__ import annotations

import atexit
import os

from outpost_sync import Outpost

METER_ID = os.environ.get("OUTPOST_METER_ID", "")
if not METER_ID:
    raise RuntimeError("set OUTPOST_METER_ID to the id of the meter to read balances from")

outpost = Outpost()
atexit.register(outpost.close)  # deliver what is still queued before the process exits
