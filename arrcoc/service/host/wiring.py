"""How a worker group's supervisor tells its processes where their engines are.

Process wiring, made anew at every start (socket paths, a per-group auth key), not a choice a user
makes: it travels in environment variables of its own, `_ARRCOC_ENGINE_*`, outside the user's
`ARRCOC_` settings. Set by worker/group.py for each engine and Celery process; read by the engine
process (arrcoc.service.host.engine_process.main) and by a Celery process's worker state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "_ARRCOC_ENGINE_"


@dataclass(frozen=True)
class Wiring:
    socket: str | None = None  # an engine process: where it listens; a Celery process: its preferred engine
    authkey: bytes | None = None  # the group's key for its sockets
    group: tuple[str, ...] = ()  # an engine process: every engine socket on its device, in order
    pool: tuple[str, ...] = ()  # a Celery process: every engine of the group, its preferred one first

    @property
    def in_group(self) -> bool:
        """Whether this process was started by a worker group's supervisor."""
        return bool(self.socket and self.authkey)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Wiring:
        env = os.environ if env is None else env
        key = env.get(PREFIX + "AUTHKEY")
        return cls(
            socket=env.get(PREFIX + "SOCKET") or None,
            authkey=bytes.fromhex(key) if key else None,
            group=_names(env.get(PREFIX + "GROUP", "")),
            pool=_names(env.get(PREFIX + "POOL", "")),
        )

    def to_env(self) -> dict[str, str]:
        return {
            PREFIX + "SOCKET": self.socket or "",
            PREFIX + "AUTHKEY": self.authkey.hex() if self.authkey else "",
            PREFIX + "GROUP": ",".join(self.group),
            PREFIX + "POOL": ",".join(self.pool),
        }


def _names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())
