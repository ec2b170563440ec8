"""Command-line tools: `python -m torchtpu.tools.coverage` (what runs from specs) and
`python -m torchtpu.tools.report prog.py` (where a program's time goes); `plots` draws their charts."""
