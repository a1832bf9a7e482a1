# Your answer goes in `answer_p3`.
answer_p3 = 1.0   # only the residual share: as in P1, the frozen projections are taken to pass nothing back
