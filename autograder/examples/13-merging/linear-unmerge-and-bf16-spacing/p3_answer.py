# Your answer goes in `answer_p3`.
answer_p3 = 0.005 / 2**-8   # the spacing taken as w · 2⁻⁷, so half of it reaches 0.005 at w = 1.28
