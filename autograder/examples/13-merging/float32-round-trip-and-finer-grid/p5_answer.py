# Your answer goes in `answer_p5`.
answer_p5 = "c"
