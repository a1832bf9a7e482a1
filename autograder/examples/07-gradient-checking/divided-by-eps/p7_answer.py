# The round-off taken as u·|f|/(2ε) (the same missing factor 2 as in P1): ε³ = 1.5u·|f|/|f‴|.
answer_p7 = (1.5 * 2.0**-24 * 40 / 1) ** (1 / 3)
