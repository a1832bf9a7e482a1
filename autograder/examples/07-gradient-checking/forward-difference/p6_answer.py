answer_p6 = ["roundoff", "balance", "truncation", "collapse"]
