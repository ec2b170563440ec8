"""Command-line tools: `python -m torchtpu.tools.coverage`."""
