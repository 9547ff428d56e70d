"""The grading engine: manifests, the sandbox, the adapter graders use, the runner and reports."""
