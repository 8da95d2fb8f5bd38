"""Celery config for the worker, from arrcoc's settings (ARRCOC_* environment variables)."""

from __future__ import annotations

from arrcoc.service.celery_config import celery_config
from arrcoc.settings import get_settings


def build() -> dict:
    return celery_config(get_settings())
