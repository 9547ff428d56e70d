"""What ``nbgrader generate_assignment`` releases of a kata: its stub, never the reference.

The ``nbgrader_config.py`` that ``kata nbgrader init`` writes installs ``KataSolutions`` in place of
nbgrader's ClearSolutions. A kata's source solution cell holds the whole reference between solution
delimiters (see ``course``); this releases it as the learner starts it in the kit, the marker line
and the kata's stub. Imported by nbgrader's config only: nbgrader is an optional extra.
"""
from __future__ import annotations

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import ClearSolutions

from ..engine.manifest import katas
from ..practice.notebook import stub_cell
from .course import solution_id


class KataSolutions(ClearSolutions):
    """ClearSolutions, but a kata's solution cell is released as the kata's stub; any other cell
    (an instructor's own) is cleared as nbgrader does."""

    def preprocess_cell(self, cell, resources, cell_index):
        ids = {solution_id(kata): kata for kata in katas()}
        kata = ids.get(cell.metadata.get("nbgrader", {}).get("grade_id"))
        if kata is None:
            return super().preprocess_cell(cell, resources, cell_index)
        cell.source = stub_cell(kata)
        return cell, resources


def preprocessors() -> list:
    """generate_assignment's preprocessors, in nbgrader's order, KataSolutions in ClearSolutions' place."""
    default = GenerateAssignment.class_traits()["preprocessors"].default()
    return [KataSolutions if p is ClearSolutions else p for p in default]
