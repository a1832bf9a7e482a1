# Your answer goes in `answer_p7`.
answer_p7 = "d"
