"""One pytest grader per kata (``<kata>.py``), the judge that runs them (``engine/``), and the
features built on it (``practice/``, ``classroom/``, ``authoring/``)."""
