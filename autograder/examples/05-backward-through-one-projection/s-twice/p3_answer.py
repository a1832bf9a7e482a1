# Your answer goes in `answer_p3`.
answer_p3 = (s_p3 * s_p3 * G_p3 @ B_p3.T)[1, 1]
