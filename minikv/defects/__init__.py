"""The defects minikv reproduces: `registry` (each defect and the switch that brings it back, also `minikv.bugs`)
and `provenance` (what upstream said about each one, and when). Both are data; they import nothing above the
kernels' error classes."""
