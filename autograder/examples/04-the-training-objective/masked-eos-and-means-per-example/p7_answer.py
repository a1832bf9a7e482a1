answer_p7 = "c"
