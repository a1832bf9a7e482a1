# Your answer goes in `answer_p6`.
p_p6 = np.exp(ex["X"] @ ex["W"]) / np.exp(ex["X"] @ ex["W"]).sum()     # the forward on W, as if the model still held it
answer_p6 = ex["W"] - 0.2 * ex["X"].T @ (p_p6 - np.eye(2)[[ex["target"]]])
