# Your answer goes in `answer_w1`.
answer_w1 = "a"
