# Your answer goes in `answer_p6`.
answer_p6 = "a"
