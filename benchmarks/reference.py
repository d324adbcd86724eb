"""The default job's reference numbers as package data: `server_app/reference.json`, what the
summary's reference line (`server_app.reporting.comparison_hint`) needs from the committed comparison
`results/default-job.json`: its methods, its settings and each method's final personalized and
fine-tuned means. The product reads only that file, never `benchmarks/`. Run
`python -m benchmarks.reference` after `python -m benchmarks.compare ... --name default-job`;
tests/test_first_run.py checks that the two agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR
from server_app.reporting import REFERENCE, REFERENCE_FILE

MEANS = ("personalized", "finetuned")  # the final results the reference line quotes


def package_reference(comparison: dict[str, Any]) -> dict[str, Any]:
    """The parts of a comparison (`benchmarks.compare`'s JSON) the reference line reads."""
    return {
        "name": comparison["name"],
        "methods": list(comparison["methods"]),
        "settings": comparison["settings"],
        "summaries": [
            {"method": s["method"],
             "final": {key: {"mean": s["final"][key]["mean"]} for key in MEANS
                       if (s["final"].get(key) or {}).get("mean") is not None}}
            for s in comparison["summaries"]],
    }


def main(source: Path = RESULTS_DIR / f"{REFERENCE}.json", target: Path = REFERENCE_FILE) -> None:
    target.write_text(json.dumps(package_reference(json.loads(source.read_text())), indent=1,
                                 sort_keys=True) + "\n")
    print(f"written: {target} (from {source})")


if __name__ == "__main__":
    main()
