# Your answer goes in `answer_p3`.
answer_p3 = 300 * 2**-7
