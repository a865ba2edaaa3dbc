"""Outpost's conformance data (shared with the TypeScript SDK) and the Python tools that record it.

See ``conformance/README.md``. The data files are language-neutral JSON; the modules here record
them (``python -m conformance.record_lua_vectors``) and run one vector (:mod:`.lua_vectors`).
"""

from __future__ import annotations
