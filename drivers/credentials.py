"""Where a driver's ``*_env`` credentials are found: the process environment, then systemd's
credentials (``LoadCredential=NAME:PATH`` in the unit: the file ``$CREDENTIALS_DIRECTORY/NAME``,
readable only by the service's user, never in the environment; systemd.exec(5)
"Credentials"). A switch's ``password_env: POLATIS_PASSWORD`` is then served by
``Environment=``/``EnvironmentFile=`` or by ``LoadCredential=POLATIS_PASSWORD:...`` alike, and
``lightrail check-config`` (``ExecStartPre=``) sees what the daemon sees.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

CREDENTIALS_DIRECTORY_ENV = "CREDENTIALS_DIRECTORY"


class CredentialEnviron(Mapping[str, str]):
    """A read-only mapping of credential names to values: ``environ`` (default ``os.environ``,
    read at each lookup) first, then the file of that name in ``directory`` (default
    ``$CREDENTIALS_DIRECTORY`` as ``environ`` has it; none: environment only), read at each
    lookup (a driver reads its credentials at each login), one trailing newline removed. A name
    with a path separator, or an unreadable or non-UTF-8 file, is not found (``KeyError``)."""

    def __init__(self, environ: Mapping[str, str] | None = None,
                 directory: Path | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._directory = directory

    @property
    def directory(self) -> Path | None:
        """The credentials directory looked in, None when there is none."""
        if self._directory is not None:
            return self._directory
        given = self._environ.get(CREDENTIALS_DIRECTORY_ENV)
        return Path(given) if given else None

    def _file(self, name: str) -> str | None:
        directory = self.directory
        if directory is None or not name or "/" in name or name in (".", ".."):
            return None
        try:
            text = (directory / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        return text[:-1] if text.endswith("\n") else text

    def __getitem__(self, name: str) -> str:
        value = self._environ.get(name)
        if value:
            return value
        found = self._file(name)
        if found is None:
            raise KeyError(name)
        return found

    def _names(self) -> list[str]:
        names = dict.fromkeys(self._environ)
        directory = self.directory
        if directory is not None:
            with contextlib.suppress(OSError):
                names.update(dict.fromkeys(sorted(p.name for p in directory.iterdir()
                                                  if p.is_file())))
        return list(names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:  # never the values
        return f"CredentialEnviron(directory={self.directory})"


__all__ = ["CREDENTIALS_DIRECTORY_ENV", "CredentialEnviron"]
