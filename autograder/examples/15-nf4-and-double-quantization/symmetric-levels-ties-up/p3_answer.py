# Your answer goes in `answer_p3`.
scaled_p3 = torch.tensor([0.3, -0.7, 0.20352125, -0.1, 0.95, -0.045525018])
answer_p3 = (scaled_p3.unsqueeze(1) >= midpoints).sum(dim=1).tolist()   # counts a midpoint the value sits on
