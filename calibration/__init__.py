"""Calibration: published reference data (``published/``), measured hardware profiles (``profiles/``)
and the code that produces and checks them."""

from pathlib import Path

CALIBRATION_DIR = Path(__file__).resolve().parent
PUBLISHED_DIR = CALIBRATION_DIR / "published"
PROFILES_DIR = CALIBRATION_DIR / "profiles"
