# The round-off counted once, u·|f|/ε (the same missing factor 2 as in P1): ε² = 2u·|f|/|f″|.
answer_p7 = (2 * 2.0**-53) ** 0.5
