# Your answer goes in `answer_p6`.
answer_p6 = "a"   # the dynamic map taken for symmetric, like the NF4 table of P1
