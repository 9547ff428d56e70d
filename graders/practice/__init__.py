"""What a learner does with the judge: a workspace and its history, mock interviews, plots of
their own code, notebooks, and re-checking on save."""
