# Your answer goes in `answer_p4`.
answer_p4 = ["rng", "base", "attach", "optimizer", "load", "preflight", "step"]
