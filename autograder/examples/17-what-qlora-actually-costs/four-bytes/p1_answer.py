# Your answer goes in `answer_p1` (decimal GB).
# Typical mistake: "4-bit" read as 4 bytes per base weight.
n, a = 34e9, 50e6
blocks = math.ceil(n / 64)
answer_p1 = (4 * n + 12 * a + blocks * 1 + 4 * math.ceil(blocks / 256)) / 1e9
