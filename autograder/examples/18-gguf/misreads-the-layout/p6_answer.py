# Your answer goes in `answer_p6`.
answer_p6 = 49152 * 576 * 5 / 8
