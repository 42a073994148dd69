"""YAML descriptions of GPUs and clusters, shipped as package data so that installed copies find them."""

from pathlib import Path

SPEC_DIR = Path(__file__).resolve().parent
