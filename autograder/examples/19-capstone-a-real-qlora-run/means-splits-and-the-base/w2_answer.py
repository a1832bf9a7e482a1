# Your answer goes in `answer_w2`.
answer_w2 = "b"
