"""One pytest grader per kata (``<kata>.py``) and the grading engine (``engine/``)."""
