answer_p7 = "a"
