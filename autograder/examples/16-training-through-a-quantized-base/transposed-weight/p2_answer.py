# Your answer goes in `answer_p2`.
answer_p2 = {"b"}
