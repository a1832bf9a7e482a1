answer_w2 = 32
