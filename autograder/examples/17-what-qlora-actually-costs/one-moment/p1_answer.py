# Your answer goes in `answer_p1` (decimal GB).
# Typical mistake: one Adam moment per adapter parameter (4 + 4 + 4 bytes in fp32).
n, vocab, hidden, a = 6.74e9, 32_000, 4_096, 40e6
kept = 2 * vocab * hidden
answer_p1 = ((n - kept) * 0.5 + kept * 4 + a * 12) / 1e9
