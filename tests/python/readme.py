"""The README's integration snippets, as the tests run them."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet(name: str) -> str:
    """The ```python block after the README's ``<!-- snippet: NAME ...-->`` marker."""
    text = README.read_text()
    start = text.index("```python\n", text.index(f"<!-- snippet: {name} ")) + len("```python\n")
    return text[start:text.index("```", start)]
