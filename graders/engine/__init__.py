"""The judge: manifests, the sandbox and its worker, the adapter graders use, the runner that
grades one file for one kata, and the result. It imports nothing from the packages around it."""
