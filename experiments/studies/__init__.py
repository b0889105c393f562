"""Studies: the logic of a study whose settings live in a config (experiments/configs/): its declared
decision rules applied to the runs, its cost model, which finished runs still need what, and its
privacy accounting. A config imports no study at load time; a study imports its config and the
report."""
