"""The lab's contract lives in the repository: every "SPEC §N" (and §9.M) that the code, a
command's help, the docs or a test cites resolves to a section of docs/contract.md, and nothing
points outside a clone for it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"
pytestmark = pytest.mark.unit
CITATION = re.compile(r"SPEC ?§ ?(\d+)(?:\.(\d+))?")


def tracked_text_files() -> dict[str, str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    texts = {}
    for name in listed.stdout.split():
        path = ROOT / name
        if path.suffix in (".py", ".md", ".toml", ".json", ".html", ".txt", ".sh", ".ini") and path.is_file():
            texts[name] = path.read_text(errors="replace")
    return texts


def contract_sections() -> dict[int, int]:
    """{section number: how many numbered items it lists}."""
    text = CONTRACT.read_text()
    parts = re.split(r"^## §(\d+) ", text, flags=re.M)
    sections = {}
    for number, body in zip(parts[1::2], parts[2::2]):
        sections[int(number)] = len(re.findall(r"^\d+\. ", body, flags=re.M))
    return sections


def test_the_contract_has_its_twelve_sections_in_order():
    text = CONTRACT.read_text()
    assert [int(n) for n in re.findall(r"^## §(\d+) ", text, flags=re.M)] == list(range(1, 13))
    assert contract_sections()[9] == 5  # the five failure modes the tests must catch


def test_every_spec_citation_resolves_to_a_section_of_the_contract():
    sections = contract_sections()
    cited = 0
    for name, text in tracked_text_files().items():
        for m in CITATION.finditer(text):
            section, item = int(m.group(1)), m.group(2)
            assert section in sections, f"{name}: {m.group(0)} has no section in docs/contract.md"
            if item is not None:
                assert 1 <= int(item) <= sections[section], f"{name}: {m.group(0)} has no item in docs/contract.md"
            cited += 1
    assert cited >= 100  # the suite and the code cite it throughout


def test_nothing_points_outside_the_clone_for_the_contract():
    this = str(Path(__file__).relative_to(ROOT))
    outside = [
        name
        for name, text in tracked_text_files().items()
        if name != this and re.search(r"shared/SPEC|\.\./shared", text)
    ]
    assert outside == [], outside
    assert "docs/contract.md" in (ROOT / "README.md").read_text()


def test_the_contract_states_the_numbers_the_tests_pin():
    text = CONTRACT.read_text()
    for number in ("4,399,104", "168 projections", "63 AdamW updates", "210 updates", "672", "2,040", "1,280"):
        assert number in text, number
    assert "r_t = −0.02 · (logp_old_t − logp_ref_t)" in text and "clip(rho, 0.8, 1.2)" in text
