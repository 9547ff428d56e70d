"""What nbgrader does in a kata course: ``generate_assignment`` releases a kata's stub, never the
reference, and ``collect`` copies links as links.

The ``nbgrader_config.py`` that ``kata nbgrader init`` writes installs ``KataSolutions`` in place of
nbgrader's ClearSolutions. A kata's source solution cell holds the whole reference between solution
delimiters (see ``course``); this releases it as the learner starts it in the kit, the marker line
and the kata's stub. It also installs ``KataCollect`` as nbgrader's collect. Imported by nbgrader's
config only: nbgrader is an optional extra.
"""
from __future__ import annotations

import os
import shutil

from nbgrader.converters import GenerateAssignment
from nbgrader.exchange.default import ExchangeCollect
from nbgrader.preprocessors import ClearSolutions
from nbgrader.utils import ignore_patterns

from ..engine.manifest import katas
from ..practice.notebook import stub_cell
from .batch import TIMESTAMP   # when nbgrader submit sent the submission, read by nbgrader collect --update
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


class KataCollect(ExchangeCollect):
    """nbgrader's collect, which copies a link as a link. nbgrader's own copy follows links: one
    that a learner plants in the exchange's inbound, to source/ (which holds the reference) or a
    classmate's notebook, would reach submitted/ as that file, and be graded as the learner's
    work. As a link, `kata nbgrader autograde` refuses it with a sentence."""

    def do_copy(self, src, dest, log=None):
        """nbgrader's copy (its size limit, ignore and include patterns, group permissions), with
        every link kept as a link, never followed. A link in place of the submission's folder
        becomes a folder of links to what it holds: nbgrader's `collect --update` deletes that
        folder with rmtree, which refuses a link. nbgrader reads timestamp.txt itself: a link of
        that name is left out."""
        if os.path.islink(src):
            target = os.path.realpath(src)
            os.mkdir(dest)
            try:
                names = set(os.listdir(target)) - {TIMESTAMP}
            except OSError:   # no folder there: nothing to link to, and the other submissions are collected
                names = set()
            for name in names:
                os.symlink(os.path.join(target, name), os.path.join(dest, name))
            return
        size = self.get_size(src)   # links not counted
        if size > 1000 * self.coursedir.max_dir_size:
            raise RuntimeError(f"Directory size is too big. Size is {size}, maximum size is "
                               f"{1000 * self.coursedir.max_dir_size}")
        nbgraders = ignore_patterns(exclude=self.coursedir.ignore, include=self.coursedir.include,
                                    max_file_size=self.coursedir.max_file_size, log=self.log)

        def ignored(folder, names):
            linked = os.path.islink(os.path.join(folder, TIMESTAMP))
            return nbgraders(folder, names) + ([TIMESTAMP] if linked else [])

        shutil.copytree(src, dest, symlinks=True, ignore=ignored)
        if self.coursedir.groupshared:   # group read and write, as nbgrader gives them
            for folder, _, files in os.walk(dest):
                self._share(folder, 0o2770, 0o2777)
                for name in files:
                    self._share(os.path.join(folder, name), 0o660, 0o777)

    def _share(self, path: str, bits: int, keep: int):
        if os.path.islink(path):   # its target is no part of the submission
            return
        mode = os.stat(path).st_mode
        if mode & bits != bits:
            try:
                os.chmod(path, (mode | bits) & keep)
            except PermissionError:
                self.log.warning("Could not update permissions of %s to make it groupshared", path)
