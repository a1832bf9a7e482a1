# Your answer goes in `answer_w3`.
d = (0.045 - -0.030) / 15
answer_w3 = d * round((0.014 - -0.030) / d)      # decoded as d · q, without the minimum
