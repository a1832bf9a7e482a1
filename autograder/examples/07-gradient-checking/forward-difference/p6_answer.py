answer_p6 = ["central_float64", "central_float32", "forward_float64", "forward_float32"]
