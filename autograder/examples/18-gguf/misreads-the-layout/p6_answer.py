# Your answer goes in `answer_p6`.
# Typical mistake: one more bit doubles the levels (16 to 32), so the error is taken to halve.
answer_p6 = syn["Q4_1(W) vs W"] / 2
