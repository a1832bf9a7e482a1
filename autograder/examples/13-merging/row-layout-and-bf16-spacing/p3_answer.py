# Your answer goes in `answer_p3`.
answer_p3 = 2**-8
