#!/usr/bin/env bash
# The Compose demo's end-to-end test (tests/test_compose_demo.py), with its transcript kept.
#
#   sudo docker/scripts/demo_test.sh            the test; transcript in outputs/demo-transcript.txt
#   sudo docker/scripts/demo_test.sh --record   the same, written to docker/demo-transcript.txt (the
#                                               committed transcript the Compose page quotes)
#
# Runs the test with BOUQUET_COMPOSE_E2E=1 under the project's end-to-end lock and writes what it
# printed (timings, image sizes, the run folder) with the date, the commit and Docker's version.
# The test runs with the repository's virtual environment (.venv/bin/python, as the README's quick
# start makes it) unless PYTHON names another interpreter with Bouquet installed. It reuses the
# wheelhouse (docker/wheels/) and the images the Compose page's steps made. Too slow for CI on 2 cores
# (docs/deploy-compose.md, "Testing it").
set -euo pipefail
cd "$(dirname "$0")/../.."
out=outputs/demo-transcript.txt
for arg in "$@"; do
    case $arg in
        --record) out=docker/demo-transcript.txt ;;
        *) echo "usage: $0 [--record]" >&2; exit 2 ;;
    esac
done
if [[ -n ${PYTHON:-} ]]; then
    python=$PYTHON
elif [[ -x .venv/bin/python ]]; then
    python=.venv/bin/python
else
    python=python3
fi
if ! "$python" -c "import server_app, pytest" 2>/dev/null; then
    echo "$python cannot import Bouquet and pytest: make the README's venv (.venv) or set PYTHON" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
{
    echo "# docker/scripts/demo_test.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
    echo "# $(nproc) CPU cores, $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo
} > "$out"
status=0
BOUQUET_COMPOSE_E2E=1 flock /tmp/bouquet-e2e.lock "$python" -m pytest -s -p no:cacheprovider \
    -o log_cli=false tests/test_compose_demo.py 2>&1 | tee -a "$out" || status=$?
echo "transcript: $out"
exit "$status"
