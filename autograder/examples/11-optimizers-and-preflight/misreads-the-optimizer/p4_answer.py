answer_p4 = "b"
