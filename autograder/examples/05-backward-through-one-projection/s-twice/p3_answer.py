# Your answer goes in `answer_p3`.
answer_p3 = (s_p3 * X_p3.T @ (s_p3 * D_p3 @ B_p3.T))[2, 0]
