# Your answer goes in `answer_w2`.
answer_w2 = 0   # "the frozen projections pass nothing back"
