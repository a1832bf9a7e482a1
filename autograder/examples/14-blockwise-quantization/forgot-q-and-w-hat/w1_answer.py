# Your answer goes in `answer_w1`.
answer_w1 = round(0.6 / 0.9)
