"""What a background alert job (evaluation, sending) last failed at, so a lasting failure is logged once, when it
starts, and once more when it ends, rather than every round."""

from __future__ import annotations

import logging

log = logging.getLogger("gpufleet.alerts")


class FailureLog:
    """The last failure of each thing a job does (a rule, a target, the round), by name. `activity` starts each
    line ("alert sending"); `retried` says in the warning that the job tries again."""

    def __init__(self, activity: str, *, retried: bool = False) -> None:
        self._activity = activity
        self._then = ", will retry" if retried else ""
        self.last: dict[str, str] = {}

    def failed(self, what: str, reason: str) -> None:
        if self.last.get(what) != reason:
            log.warning("%s: %s failed%s: %s", self._activity, what, self._then, reason)
        self.last[what] = reason

    def worked(self, what: str) -> None:
        if self.last.pop(what, None) is not None:
            log.info("%s: %s works again", self._activity, what)
