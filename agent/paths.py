"""Where one pivot home keeps its files (the ledger in state/, generated documents in docs_out/): the Paths every
tool, engine and report is handed. Part of the core: it imports nothing of pivot's but its settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    """Where one home keeps its files: the ledger in state/, generated documents in docs_out/."""

    home: Path

    @classmethod
    def from_env(cls, home: str | Path | None = None) -> Paths:
        """`home`, else $PIVOT_HOME, else the current directory."""
        from agent.settings import settings

        chosen = home if home is not None else settings().home
        return cls(Path(chosen).expanduser().resolve())

    @property
    def state_dir(self) -> Path:
        return self.home / "state"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "pivot.db"

    @property
    def docs_root(self) -> Path:
        return self.home / "docs_out"

    def session_state_dir(self, session_id: str) -> Path:
        """state/<session>/: server logs and raw benchmark JSONL of one session."""
        return self.state_dir / session_id

    def logs_dir(self, session_id: str) -> Path:
        return self.session_state_dir(session_id) / "logs"

    def raw_dir(self, session_id: str) -> Path:
        return self.session_state_dir(session_id) / "bench"

    def docs_dir(self, session_id: str) -> Path:
        """docs_out/<session>/: improvement documents and status summaries."""
        return self.docs_root / session_id

    def relative(self, path: Path) -> str:
        """A path as the ledger records it: relative to the home when inside it."""
        try:
            return str(path.resolve().relative_to(self.home))
        except ValueError:
            return str(path)
