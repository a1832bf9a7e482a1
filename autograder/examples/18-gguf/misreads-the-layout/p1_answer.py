# Your answer goes in `answer_p1`.
answer_p1 = {"a", "b", "e", "f"}
