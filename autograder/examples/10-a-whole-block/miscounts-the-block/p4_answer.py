# Your answer goes in `answer_p4`.
answer_p4 = "b"   # "k_proj is frozen, so it passes nothing back anyway"
