# Your answer goes in `answer_p6`.
answer_p6 = [0.9, 0.9]   # 0.62 on the outlier's grid (step 6.3 / 7) in both blocks
