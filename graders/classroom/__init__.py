"""What an instructor does with the judge: grade a class in batch, build student bundles, and
grade through Gradescope and nbgrader."""
