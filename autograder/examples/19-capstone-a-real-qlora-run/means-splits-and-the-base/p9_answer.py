# Your answer goes in `answer_p9`.
answer_p9 = ["a", "b", "d"]
