"""`python -m pipeline.accuracy ...` is `pipeline eval ...` without the top-level CLI."""
from pipeline.accuracy.cli import eval_main

raise SystemExit(eval_main())
