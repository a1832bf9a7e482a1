# Your answer goes in `answer_p4`.
answer_p4 = 1.0
