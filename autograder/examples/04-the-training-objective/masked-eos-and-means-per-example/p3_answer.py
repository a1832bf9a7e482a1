answer_p3 = 1   # the running count looks like the window's N
