answer_p6 = "a"
