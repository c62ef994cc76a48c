"""`python -m minikv` runs the minikv command."""
import sys

from minikv.cli import main

sys.exit(main())
