answer_p7 = 1e-7 * 40 / (2 * 1e-3)
