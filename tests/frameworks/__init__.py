"""The framework matrix: real jobs of each framework with a planted slow rank."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
