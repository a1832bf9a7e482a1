# Your answer goes in `answer_p1` (decimal GB).
# Typical mistake: one Adam moment per adapter parameter (2 + 2 + 4 bytes).
n, a = 34e9, 50e6
blocks = math.ceil(n / 64)
answer_p1 = (0.5 * n + 8 * a + blocks * 1 + 4 * math.ceil(blocks / 256)) / 1e9
