"""Logging setup for the agent: one line per event, as text for people or JSON for pipelines;
and the one way a metrics hook is called (:func:`call_hook`: what it raises is logged).

Events carry structured fields through ``extra={"fields": {...}}``; the text format appends
them as ``key=value`` and the JSON format emits them as keys, so both stay greppable.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<5} {record.getMessage()}"
        fields: dict[str, Any] = getattr(record, "fields", None) or {}
        if fields:
            line += " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text(value: Any) -> str:
    text = str(value)
    return repr(text) if (" " in text or not text) else text


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    """Send the package's logs to stderr in ``fmt`` (text|json) at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # asyncio's chatter, and the API server client's line per HTTP request (every slice
    # write, every claim read), would drown the event lines; their failures are ours to log.
    for chatty in ("asyncio", "httpx2", "httpcore2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def fields(**values: Any) -> dict[str, Any]:
    """``extra`` for a log call: ``log.info("spec written", extra=fields(cls="loop"))``."""
    return {"fields": values}


def call_hook(
    hook: Callable[..., object] | None, *args: object, what: str, logger: logging.Logger
) -> None:
    """Call ``hook`` (a metrics hook; None: nothing to call) with ``args``. What it raises
    is logged to ``logger`` as ``<what> failed`` with its traceback and goes no further: a
    hook must never fail the call it counts."""
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        logger.exception("%s failed", what)
