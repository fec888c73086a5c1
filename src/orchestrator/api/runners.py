"""Runners (placeholder until the runner configuration domain lands)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["Runner"])
