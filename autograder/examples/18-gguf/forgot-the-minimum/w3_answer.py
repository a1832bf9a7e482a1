# Your answer goes in `answer_w3`.
answer_w3 = 4 + 16 / 32
