# Your answer goes in `answer_p4`.
import torch
answer_p4 = torch.tensor((16 / 64) * math.sqrt(64 / 64) / ((16 / 4) * math.sqrt(4 / 4)), requires_grad=True)  # a tensor that requires grad: fine
