# Typical mistake: "a zero gradient moves nothing but the decay", as for a tensor whose gradient was always zero:
# step 1 is Adam's first step (lr times the sign), steps 2 and 3 only multiply by (1 - lr*wd).
answer_p3 = (2.5 * (1 - 0.05 * 0.2) - 0.05) * (1 - 0.05 * 0.2) ** 2
