"""Entry point of `python -m minikv.bench`."""
from . import main

raise SystemExit(main())
