"""docs/performance.md is what benchmarks/results_page.py makes of benchmarks/data/, and every
result there says which commit it comes from.

Imports the generator and reads the JSON files; spawns no processes.
"""
import json
import os
import re
import sys

import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import results_page  # noqa: E402

SHA = re.compile(r"[0-9a-f]{40}")


def test_page_is_generated_from_the_data():
    with open(results_page.PAGE) as f:
        committed = f.read()
    assert results_page.render(results_page.load_data()) == committed, (
        "docs/performance.md differs from benchmarks/data: run python3 benchmarks/results_page.py")


def test_every_scenario_has_its_file():
    files = {n for n in os.listdir(results_page.DATA) if n.endswith(".json")}
    assert set(results_page.SCENARIOS) == files


@pytest.mark.parametrize("name", sorted(results_page.SCENARIOS))
def test_result_has_provenance_with_commit(name):
    with open(os.path.join(results_page.DATA, name)) as f:
        data = json.load(f)
    combined = data["runs"] if "combined_from" in data["provenance"] else []  # each run has its own
    for record in [data] + combined:
        prov = record["provenance"]
        commit = prov["recorded_in_commit"] if prov.get("reconstructed") else prov["commit"]
        assert commit and SHA.fullmatch(commit), (name, prov)
        assert prov["machine"] and prov["date"], (name, prov)
        assert "command" in prov, (name, prov)
