answer_p6 = "b"
