from __future__ import annotations

from bench._env import Env
from bench._stats import Figure


def run(env: Env) -> list[Figure]:
    raise NotImplementedError
