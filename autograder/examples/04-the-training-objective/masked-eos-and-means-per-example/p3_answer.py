answer_p3 = (0.5 + 0.25) / 2
