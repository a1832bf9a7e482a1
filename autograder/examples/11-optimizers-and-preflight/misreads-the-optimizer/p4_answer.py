answer_p4 = "d"
