"""One line of the doctor's report: a status (OK, WARN, FAIL), what was checked, what was
found and, short of OK, what to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Check", "Status"]

Status = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True, slots=True)
class Check:
    status: Status
    topic: str
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4} {self.topic}: {self.message}"
        return f"{text} -> {self.fix}" if self.fix and self.status != "OK" else text
