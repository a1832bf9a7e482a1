# Your answer goes in `answer_p6`.
G6, U6 = x_p6 * w_gate_p6, x_p6 * w_up_p6
dH6 = dy_p6 * w_down_p6
dG6 = dH6 * U6 * float(swish_grad(G6, 1.0))
dU6 = dH6 * G6 / (1 + np.exp(-G6))
answer_p6 = dG6 * w_gate_p6 + dU6 * w_up_p6
