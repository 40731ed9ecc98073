"""ASGI entry for multi-worker serving (`uvicorn app.asgi:app`): settings come from the environment."""

from __future__ import annotations

from .main import create_app

app = create_app()
