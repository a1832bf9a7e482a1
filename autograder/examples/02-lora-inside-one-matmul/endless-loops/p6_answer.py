# Your answer goes in `answer_p6`.
import sys
print("a note on stderr from an answer cell (not graded)", file=sys.stderr)
answer_p6 = "b"
