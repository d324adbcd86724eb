#!/usr/bin/env bash
# The Compose demo's end-to-end test (tests/test_compose_demo.py), with its transcript kept.
#
#   docker/scripts/demo_test.sh            (as root on a machine where Docker may be installed)
#
# Runs the test with BOUQUET_COMPOSE_E2E=1 under the project's end-to-end lock and writes what it
# printed (timings, image sizes, the run folder) with the date, the commit and Docker's version to
# docker/demo-transcript.txt. Too slow for CI on 2 cores (docs/deploy-compose.md, "Testing it").
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docker/demo-transcript.txt
python=${PYTHON:-python}
{
    echo "# docker/scripts/demo_test.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
    echo "# $(nproc) CPU cores, $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo
} > "$out"
status=0
BOUQUET_COMPOSE_E2E=1 flock /tmp/bouquet-e2e.lock "$python" -m pytest -s -p no:cacheprovider \
    -o log_cli=false tests/test_compose_demo.py 2>&1 | tee -a "$out" || status=$?
exit "$status"
