# Your answer goes in `answer_p11`.
answer_p11 = ["a", "b", "d"]
