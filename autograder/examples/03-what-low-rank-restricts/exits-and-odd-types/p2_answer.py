# Your answer goes in `answer_p2`.
import sys
sys.exit("stop here")  # SystemExit is an error in this cell only; the kernel lives on
answer_p2 = math.sqrt(3.1**2 - 1**2)
