"""Unit tests of the manifest checks: each check on small inputs, a good one
passing and a bad one reported. Run with scripts/check-manifests.sh
--self-test (the virtualenv's Python, PYTHONPATH=scripts)."""
