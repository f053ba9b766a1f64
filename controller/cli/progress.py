"""The one progress display of the long-running commands (``replay``, ``demo``, ``evaluate``,
``slices-eval``, ``bench/faults.py``): a rich bar on stderr, shown only when stderr is a
terminal, so piped or redirected output carries no progress text and no ANSI codes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


@dataclass(frozen=True, slots=True)
class ProgressTask:
    """One bar of a :func:`progress_display`; ``shown``: whether it draws anything (False when
    the console is not a terminal or the display was disabled: then every update is a no-op
    for the screen)."""

    progress: Progress
    task: TaskID
    shown: bool

    def update(self, done: int, total: int | None = None,
               description: str | None = None) -> None:
        """``done`` steps of ``total`` (unchanged when None) completed; ``description``
        replaces the bar's label when given."""
        if description is None:
            self.progress.update(self.task, completed=done, total=total)
        else:
            self.progress.update(self.task, completed=done, total=total,
                                 description=description)

    def finish(self) -> None:
        """Stop drawing now (before printing the command's result on the same terminal);
        the end of the ``progress_display`` block does it otherwise."""
        self.progress.stop()

    def callback(self, done: int, total: int) -> None:
        """``update`` as an ``on_progress(done, total)`` callback."""
        self.update(done, total)


def stderr_console() -> Console:
    """The console progress draws on: stderr, a terminal or not as the stream is."""
    return Console(stderr=True)


@contextmanager
def progress_display(what: str, total: int | None = None, *, console: Console | None = None,
                     enabled: bool = True) -> Iterator[ProgressTask]:
    """A bar labelled ``what`` with ``total`` steps (None: unknown until an update gives it),
    elapsed time and ``done/total``, on ``console`` (default stderr), drawn only when
    ``enabled`` and the console is a terminal (``Console.is_terminal``; ``force_terminal=True``
    makes it one). The bar stays on screen when the block ends."""
    out = console if console is not None else stderr_console()
    shown = enabled and out.is_terminal
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=out, disable=not shown)
    with bar:
        yield ProgressTask(bar, bar.add_task(what, total=total), shown)
